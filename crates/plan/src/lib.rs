//! The headroom planner: predicts the memory (per `Category`) and time of a training step for a
//! real model on real hardware under every combination of memory levers, and picks the fastest
//! combination that fits.
//!
//! Layout: `model` (specs, presets, parameter inventory) → `hardware` + `workload` → `strategy`
//! → `cost` (memory and time per strategy) → `search` (enumerate, filter, rank) → `advice`
//! (explanations, what to change when nothing fits) → `export` (DeepSpeed, Accelerate,
//! headroom). `estimators` reproduces DeepSpeed's and Accelerate's own estimators for comparison.
//!
//! Not for: running anything. The planner uses only the shared types of `headroom-memory`.

pub mod advice;
pub mod cost;
pub mod error;
pub mod estimators;
pub mod export;
pub mod hardware;
pub mod model;
pub mod search;
pub use headroom_strategy as strategy;
pub mod workload;

pub use error::{PlanError, Result};
