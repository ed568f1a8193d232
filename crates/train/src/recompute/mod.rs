//! Recomputation planning for activation checkpointing: the chain model of activation memory,
//! the classic plans (none, every block, every k-th block, √n segments), Chen et al.'s budgeted
//! greedy planner with its search, and the exact least-recompute plan for a budget.

pub mod chain;
pub mod chen;
pub mod dry_run;
pub mod optimal;

pub use chain::{Chain, Plan, PlanCost};
pub use optimal::optimal_plan;
