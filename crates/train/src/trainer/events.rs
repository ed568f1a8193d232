//! What the trainer reports: the events of a run as it goes, the errors that stop it, and the
//! hooks that reproduce classic mistakes on purpose.
//!
//! Not for: the report at the end (see `crate::report`).

use crate::config::ConfigError;
use crate::data::{CorpusError, DataError};
use crate::save::SaveError;
use headroom_comm::CommError;
use headroom_memory::OutOfMemory;
use headroom_nn::models::ModelSpecError;
use headroom_tensor::TensorError;

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Communication(#[from] CommError),
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    Data(DataError),
    #[error(transparent)]
    Model(#[from] ModelSpecError),
    #[error("{0}")]
    OutOfMemory(OutOfMemory),
    #[error(transparent)]
    Arena(#[from] headroom_memory::ArenaError),
    #[error(
        "--allocator planned serves the arena layout that preparing the run records: build the trainer from the prepared run (Trainer::prepared, or launch)"
    )]
    NoArenaLayout,
    #[error("engine error: {0}")]
    Engine(TensorError),
    #[error(transparent)]
    Save(#[from] SaveError),
    #[error(transparent)]
    Checkpoint(#[from] headroom_nn::checkpoint::CheckpointError),
    #[error(transparent)]
    Offload(#[from] headroom_offload::OffloadError),
    #[error(transparent)]
    Policy(#[from] crate::recompute::policy::PolicyError),
    #[error("planner: {0}")]
    Planner(String),
    #[error(
        "training diverged: the loss is {loss} at step {step}; lower --lr, or use fp32 or bf16-mixed"
    )]
    Diverged { step: u64, loss: f64 },
    #[error("injected fault at step {step} (HEADROOM_FAULT)")]
    Injected { step: u64 },
    #[error(
        "rank {rank} of {world}: {oom} at step {step}; a data-parallel step cannot be retried on one rank while the others wait in its collectives, so the group stops: lower --micro-batch, or let --find-batch-size or --auto choose it by dry runs (the same on every rank)"
    )]
    GroupOutOfMemory {
        rank: usize,
        world: usize,
        step: u64,
        oom: Box<OutOfMemory>,
    },
}

impl From<DataError> for TrainError {
    /// A corpus that cannot be used stays a corpus error, as before there was a loader.
    fn from(e: DataError) -> TrainError {
        match e {
            DataError::Corpus(c) => TrainError::Corpus(c),
            other => TrainError::Data(other),
        }
    }
}

impl From<TensorError> for TrainError {
    fn from(e: TensorError) -> Self {
        match e {
            TensorError::OutOfMemory(oom) => TrainError::OutOfMemory(oom),
            other => TrainError::Engine(other),
        }
    }
}

impl From<headroom_strategy::StrategyError> for TrainError {
    fn from(e: headroom_strategy::StrategyError) -> Self {
        TrainError::Config(ConfigError::Strategy(e))
    }
}

impl From<OutOfMemory> for TrainError {
    fn from(e: OutOfMemory) -> Self {
        TrainError::OutOfMemory(e)
    }
}

/// Progress the trainer reports as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum TrainEvent {
    Step {
        step: u64,
        total: u64,
        loss: f64,
        tokens_per_s: f64,
        allocated: u64,
        reserved: u64,
        capacity: u64,
    },
    Validation {
        step: u64,
        loss: f64,
    },
    CacheEmptied {
        step: u64,
        reserved_before: u64,
        reserved_after: u64,
    },
    Warning(String),
    /// The run was saved (`--save-dir`).
    Saved {
        step: u64,
        path: String,
    },
    /// The model was written as a Hugging Face directory (`--hf-out`).
    Exported {
        path: String,
    },
    /// A step ran out of memory and is retried with half the micro-batch.
    OomRecovered {
        step: u64,
        micro_batch: usize,
        accumulation: usize,
    },
}

/// Test and demonstration hooks that reproduce classic mistakes on purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrainerHooks {
    /// Never clear gradients after a step (the forgotten `zero_grad`).
    pub skip_zero_grad: bool,
    /// Force a non-finite gradient at these optimizer steps (0-based), to exercise loss scaling.
    pub force_overflow_at: Option<u64>,
    /// Keep every micro-batch's loss tensor (a leak the guard must catch).
    pub keep_losses: bool,
    /// Rebuild a history buffer one row longer at every step and free it at the step's end:
    /// nothing grows between steps, but the step's peak does (the guard must catch it).
    pub grow_step_buffer: bool,
    /// Fail on purpose at the start of a step (see `fault`).
    pub fault: Option<super::fault::Fault>,
}
