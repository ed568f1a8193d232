//! The experiments behind `headroom bench …`: reproducible measurements of the memory levers,
//! the predictions and the machine, one file per experiment. Each takes its options as a plain
//! struct and returns a typed result (serializable, so a caller can print it as JSON); progress,
//! where an experiment reports any, goes through a callback.
//!
//! - `checkpoint`: Chen et al.'s memory-against-depth experiment on the residual MLP, each
//!   policy's step time on the GPT, the longest sequence that fits a budget;
//! - `collectives`: the communicators' bandwidth per collective and size;
//! - `loader`: the data loader's throughput, the time training waits for it, staging copies;
//! - `offload` and `offload_training`: the host update, copies, the disk tier, and the step time
//!   of each offload mode;
//! - `predict`: predicted against measured memory over the configuration matrix;
//! - `speed`: `--auto`'s speed model against measured steps.
//!
//! Not for: printing, tables or pictures (the binary's), or asserting anything about the numbers
//! (the tests of what each experiment measures do that).

pub mod checkpoint;
pub mod collectives;
pub mod loader;
pub mod offload;
pub mod offload_training;
pub mod predict;
pub mod speed;

use crate::TrainError;
use crate::config::ConfigError;
use crate::data::{CorpusError, DataError};
use crate::recompute::policy::PolicyError;
use headroom_comm::CommError;
use headroom_memory::OutOfMemory;
use headroom_memory::host_pool::OverBudget;
use headroom_offload::OffloadError;
use headroom_strategy::StrategyError;
use headroom_tensor::TensorError;
use std::path::PathBuf;

/// Why an experiment could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Engine(#[from] TensorError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    #[error(transparent)]
    Communication(#[from] CommError),
    #[error(transparent)]
    Offload(#[from] OffloadError),
    #[error(transparent)]
    OutOfMemory(#[from] OutOfMemory),
    #[error(transparent)]
    HostBudget(#[from] OverBudget),
    #[error("{action} {}: {source}", path.display())]
    File {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "--depths needs at least two different depths of one block or more (e.g. 16,64,256) to fit the memory-against-depth slopes"
    )]
    TooFewDepths,
    #[error("--ranks {0}: a collective needs at least 2 ranks")]
    TooFewRanks(usize),
    #[error("--batch {0} must be a multiple of 4 (the quarter-batch split)")]
    BatchNotSplit(usize),
    #[error("a rank panicked")]
    RankPanicked,
    #[error("MPI was initialized twice")]
    MpiInitialized,
}

/// The median of `values` (the upper one of an even count), 0 when there are none.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_hand_sorted_lists() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        // Even counts take the upper middle: sorted 1, 2, 5, 9.
        assert_eq!(median(&mut [9.0, 1.0, 5.0, 2.0]), 5.0);
        assert_eq!(median(&mut []), 0.0);
    }
}
