//! headroom's trainer: the data a run reads, the loop that applies the memory levers
//! (micro-batch and accumulation, mixed precision with loss scaling, validation without a tape),
//! checkpoints and the run's report.

pub mod accuracy;
pub mod analytical;
pub mod auto;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod policy;
pub mod predict;
pub mod prepare;
pub mod recompute;
pub mod report;
pub mod scaler;
pub mod trainer;

pub use headroom_strategy as strategy;
pub use policy::recompute_for;
pub use trainer::{TrainError, TrainEvent, Trainer, TrainerHooks, model_spec};
