//! Re-implementations of other tools' memory estimators, so their numbers can be set beside the
//! planner's: DeepSpeed's ZeRO-2/ZeRO-3 model-state estimators and `accelerate estimate-memory`.
//! Each reproduces the current upstream code and its printed format (docs/sources.md §6).
//!
//! Not for: the planner's own cost model, which counts far more than these do.

pub mod accelerate;
pub mod deepspeed;
