//! Predicting and planning headroom's own runs: the dry run (`dry_run`: the trainer on a
//! shape-only device, exact bytes per category), the planner's analytical model applied to the
//! same runs (`analytical`) and both predictions' error against measured runs (`error`), the
//! `--auto` search's evaluator and measured speed model (`auto`), and `prepare`, which readies a
//! run (auto choice, batch finding, prediction) in one call.
//!
//! Not for: running (see `trainer`).

pub mod analytical;
pub mod arena;
pub mod auto;
pub mod dry_run;
pub mod error;
pub mod prepare;

pub use arena::record_arena_layout;
pub use dry_run::{DryRun, Prediction, dry_run_counted, largest_micro_batch, predict};
