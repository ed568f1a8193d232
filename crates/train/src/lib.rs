//! headroom's engine above the model: everything that turns a configuration into a measured
//! run. Three jobs, one folder each:
//!
//! - running: `config` (the run's TOML keys and flags), `data`, `launch` (a prepared run's
//!   ranks, on threads or as the rank of an `mpirun` job, from start to report), `trainer` (the
//!   loop that applies the memory levers: micro-batch and accumulation, mixed precision with
//!   loss scaling, validation without a tape, out-of-memory recovery, leak guard), `save`
//!   (saved runs on disk, resumed bit-exactly), `scaler`, `report`;
//! - recomputation planning: `recompute` (what each activation-checkpoint policy recomputes,
//!   Chen et al.'s planner, the exact least-recompute plan for a budget);
//! - prediction and planning: `predict` (the dry run, the planner's analytical model on
//!   headroom's runs and its error, `--auto`'s search evaluator and speed model, and `prepare`,
//!   the one call that readies a run).
//!
//! "Checkpoint" names activation checkpointing only; writing a run to disk is "saving".

pub mod bench;
pub mod config;
pub mod data;
pub mod launch;
pub mod models;
pub mod predict;
pub mod pretrained;
pub mod recompute;
pub mod report;
pub mod save;
pub mod scaler;
pub mod trainer;

pub use headroom_comm as comm;
pub use headroom_strategy as strategy;
pub use predict::{auto, prepare};
pub use recompute::policy::recompute_for;
pub use trainer::{
    Fault, FaultKind, TrainError, TrainEvent, Trainer, TrainerHooks, fault_for_rank, model_spec,
};
