//! headroom tensor engine.
