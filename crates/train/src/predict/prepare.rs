//! Preparing a run: one call turns a resolved configuration into the strategy that will run and
//! its prediction — `--auto`'s choice (the fastest strategy that fits, by dry runs), the largest
//! micro-batch that fits (`--find-batch-size`), and the dry run of what was chosen, reused from
//! the search when the search already made it — and, for `--allocator planned`, the arena layout
//! of every rank, so that the trainer serves a layout and never records one. A new run whose
//! save directory already holds saves is refused here, before any work, and so is a run whose
//! saves or offload files would not fit the free space of their disks (`save::room`).
//!
//! Not for: running (see `trainer`) or printing (the binary does that).

use crate::config::RunConfig;
use crate::data::Corpus;
use crate::predict::auto::{self, AutoPlan};
use crate::predict::{Prediction, largest_micro_batch, predict, record_arena_layout};
use crate::report::AutoChoice;
use crate::save::room::{RoomError, check_room, run_needs, statvfs_volume};
use crate::trainer::TrainError;
use headroom_memory::{AllocatorKind, ArenaLayout, format_bytes};
use headroom_strategy::Pins;

/// What to decide before the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrepareOptions {
    /// Choose the fastest strategy that fits, keeping the pinned levers.
    pub auto: bool,
    /// Train with the largest micro-batch that fits (searched up to this many sequences).
    pub find_batch_size: Option<usize>,
}

/// A run ready to start.
#[derive(Debug, Clone)]
pub struct PreparedRun {
    /// The configuration that will run (the chosen strategy applied).
    pub config: RunConfig,
    /// What `--auto` chose and why.
    pub auto: Option<AutoChoice>,
    /// The micro-batch `--find-batch-size` found.
    pub found_micro_batch: Option<usize>,
    /// The dry run of the configuration that will run.
    pub prediction: Prediction,
    /// Under `--allocator planned`, the arena layout of each rank (index: rank), from a dry run of
    /// that rank; empty otherwise.
    pub arena_layouts: Vec<ArenaLayout>,
}

/// Why a run cannot be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(
        "--auto: {reason}; raise --device-memory, shorten --seq-len, or lower the effective batch (--micro-batch × --accumulation)"
    )]
    NothingFits { reason: String },
    #[error("not even a micro-batch of one sequence fits the device budget of {budget}: raise --device-memory, shorten --seq-len, or checkpoint activations", budget = format_bytes(*.budget))]
    NoMicroBatchFits { budget: u64 },
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Room(#[from] RoomError),
}

/// Decides what `config` runs (keeping `pins`) and predicts it.
pub fn prepare(
    config: RunConfig,
    corpus: &Corpus,
    pins: &Pins,
    options: PrepareOptions,
) -> Result<PreparedRun, PrepareError> {
    if let Some(root) = config.save_dir.as_deref().filter(|_| !config.resumed) {
        crate::save::check_destination(root, None).map_err(TrainError::from)?;
    }
    let mut config = config;
    let mut auto_choice = None;
    let mut prediction = None;
    if options.auto {
        let plan: AutoPlan = auto::plan(&config, corpus, pins)?;
        let reason = plan.reason(config.device_memory);
        let Some(best) = plan.recommended() else {
            return Err(PrepareError::NothingFits { reason });
        };
        auto_choice = Some(AutoChoice {
            reason,
            dry_runs: plan.evaluated(),
            predicted_tokens_per_s: best.time.tokens_per_s,
        });
        config = config.with_strategy(best.strategy);
        config.allocator = plan.allocator;
        prediction = plan.recommended_prediction.clone();
    }
    let mut found_micro_batch = None;
    if let Some(max) = options.find_batch_size {
        let m =
            largest_micro_batch(&config, corpus, max)?.ok_or(PrepareError::NoMicroBatchFits {
                budget: config.device_memory,
            })?;
        config = config.with_split(m, config.accumulation());
        found_micro_batch = Some(m);
        prediction = None;
    }
    let prediction = match prediction {
        Some(p) => p,
        None => predict(&config, corpus)?,
    };
    check_room(&run_needs(&config, &prediction)?, &statvfs_volume)?;
    let arena_layouts = arena_layouts(&config, corpus)?;
    Ok(PreparedRun {
        config,
        auto: auto_choice,
        found_micro_batch,
        prediction,
        arena_layouts,
    })
}

/// The arena layout of each of `config`'s ranks under `--allocator planned` (none otherwise):
/// each rank's requests differ where its shards do.
pub fn arena_layouts(config: &RunConfig, corpus: &Corpus) -> Result<Vec<ArenaLayout>, TrainError> {
    if config.allocator != AllocatorKind::Planned {
        return Ok(Vec::new());
    }
    let world = config.ranks();
    (0..world)
        .map(|rank| record_arena_layout(config, corpus, (rank, world)))
        .collect()
}
