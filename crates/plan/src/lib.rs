//! The headroom planner.
