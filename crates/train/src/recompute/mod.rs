//! Recomputation planning for activation checkpointing: the chain model of activation memory,
//! the classic plans (none, every block, every k-th block, √n segments), Chen et al.'s budgeted
//! greedy planner with its search, the exact least-recompute plan for a budget, and what each
//! policy of the vocabulary recomputes for a model (`policy`).

pub mod chain;
pub mod chen;
pub mod dry_run;
pub mod optimal;
pub mod policy;

pub use chain::{Chain, Plan, PlanCost};
pub use optimal::optimal_plan;
