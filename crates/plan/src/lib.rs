//! The headroom planner: predicts the memory (per `Category`) and time of a training step for a
//! real model on real hardware under every combination of memory levers, and picks the fastest
//! combination that fits.
//!
//! Layout: `model` (specs, presets, parameter inventory) → `hardware` + `workload` → `strategy`
//! (the vocabulary, re-exported from `headroom-strategy`) → `cost` (memory and time per
//! strategy; the analytical evaluator) → `search` (the one search: enumerate, filter, rank,
//! shared with the engine's dry-run evaluator) → `advice` (explanations, what to change when
//! nothing fits) → `export` (DeepSpeed, Accelerate, headroom). `mesh` gives the memory of every
//! pipeline stage's ranks under tensor and pipeline parallelism; `levers` ranks each lever applied
//! alone to one run (the memory doctor's advice). `estimators` reproduces
//! DeepSpeed's and Accelerate's own estimators for comparison.
//!
//! Not for: running anything. The planner depends on the vocabulary and on `headroom-memory`'s
//! types only, never on the engine's kernels.

pub mod advice;
pub mod calibrate;
pub mod cost;
pub mod error;
pub mod estimators;
pub mod export;
pub mod hardware;
pub mod levers;
pub mod mesh;
pub mod model;
pub mod search;
pub use headroom_strategy as strategy;
pub mod workload;

pub use error::{PlanError, Result};
