//! The run report: what `--json-report FILE` writes and what the text report prints — losses,
//! validation losses, step times, throughput, and memory per category (each category's own peak,
//! the breakdown at the moment of the overall peak, reserved and allocated peaks), next to the
//! resolved configuration, what the dry run and `--auto` predicted, and the bytes per category at
//! each phase of the first steps (start, after each forward and backward, after the step).
//!
//! A data-parallel run adds what it communicated (`communication`) and every rank's peaks.
//!
//! Not for: measuring (the trainer fills it from the device's statistics).

mod communication;
mod offload;

pub(crate) use communication::RANK_PEAKS_ELEMENTS;
pub use communication::{CommunicationReport, RankPeaks, theory_elements};
pub use offload::OffloadReport;

use crate::config::RunConfig;
use crate::data::LoaderReport;
use headroom_memory::host::ProcessMemory;
use headroom_memory::{CategoryBytes, DeviceStats, MemoryBreakdown, MemoryPeaks};
use serde::Serialize;

/// One validation pass.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct ValLoss {
    /// Optimizer steps completed when it ran.
    pub step: u64,
    pub loss: f64,
}

/// Reserved bytes around an `empty_cache` after validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CacheRelease {
    pub step: u64,
    pub reserved_before: u64,
    pub reserved_after: u64,
}

/// What `--auto` chose, and what it predicted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AutoChoice {
    /// The choice and, when a faster strategy did not fit, that one and its peak.
    pub reason: String,
    /// Dry runs the search made.
    pub dry_runs: usize,
    /// The speed model's prediction, next to the measured `tokens_per_s`.
    pub predicted_tokens_per_s: f64,
}

/// A boundary inside an optimizer step at which the report takes the device's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before the first micro-batch's forward.
    Start,
    /// After a micro-batch's forward (the activations are live).
    Forward,
    /// After a micro-batch's backward (and, under ZeRO-2/3, its gradients' reduce-scatter).
    Backward,
    /// After the optimizer step and the gradients' clearing.
    Step,
}

/// Allocated bytes per category at one phase of one of the first steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseBytes {
    pub step: u64,
    pub micro_batch: usize,
    pub phase: Phase,
    pub allocated: CategoryBytes,
}

/// Steps whose phases the report records.
pub const PHASE_STEPS: u64 = 4;

/// Everything a run reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainReport {
    /// Training loss per optimizer step (mean over its micro-batches).
    pub losses: Vec<f64>,
    pub val_losses: Vec<ValLoss>,
    pub step_times_s: Vec<f64>,
    pub tokens_per_s: f64,
    /// Allocated and reserved peaks, the breakdown at the allocated peak and at the end of the
    /// run, each category's own peak.
    #[serde(flatten)]
    pub memory: MemoryPeaks,
    pub device_memory_bytes: u64,
    /// Optimizer steps skipped by the loss scaler (fp16-mixed).
    pub skipped_steps: u64,
    pub cache_releases: Vec<CacheRelease>,
    pub warnings: Vec<String>,
    /// Parameters training updates (with LoRA: the adapters').
    pub parameters: u64,
    /// Frozen parameters (LoRA's base weights).
    #[serde(default)]
    pub frozen_parameters: u64,
    pub config: RunConfig,
    /// The dry run's peak allocated bytes, next to `peak_allocated_bytes`.
    pub predicted_peak_bytes: Option<u64>,
    /// The dry run's breakdown, next to `breakdown`.
    pub predicted_breakdown: Option<MemoryBreakdown>,
    /// Set when `--auto` chose the strategy.
    pub auto: Option<AutoChoice>,
    /// Set when the run was stopped (by a signal) after this step, before its last.
    pub stopped_at_step: Option<u64>,
    /// Bytes per category at each phase of the first [`PHASE_STEPS`] steps.
    pub phases: Vec<PhaseBytes>,
    /// The data loader: workers, queue, staging buffers, time the trainer waited for data.
    pub loader: Option<LoaderReport>,
    /// This process's resident memory at the end of the run (its peak RSS included).
    pub host: Option<ProcessMemory>,
    /// Data-parallel runs: what this rank communicated, against theory.
    pub communication: Option<CommunicationReport>,
    /// Runs of several ranks (data- or tensor-parallel): every rank's peaks, in rank order
    /// (`Trainer::gather_rank_peaks`).
    pub ranks: Vec<RankPeaks>,
    /// Offloaded runs: this rank's host and disk tiers.
    #[serde(default)]
    pub offload: Option<OffloadReport>,
    /// `--offload-activations cpu`: the most bytes of checkpointed inputs held in host memory.
    #[serde(default)]
    pub offloaded_activations_peak_bytes: Option<u64>,
    /// `--allocator planned`: how the planned arena served the run.
    #[serde(default)]
    pub arena: Option<headroom_memory::ArenaReport>,
}

impl TrainReport {
    /// An empty report of a run of `config` on a model of `parameters`.
    pub fn new(config: &RunConfig, parameters: u64) -> TrainReport {
        TrainReport {
            losses: Vec::new(),
            val_losses: Vec::new(),
            step_times_s: Vec::new(),
            tokens_per_s: 0.0,
            memory: MemoryPeaks::default(),
            device_memory_bytes: config.device_memory,
            skipped_steps: 0,
            cache_releases: Vec::new(),
            warnings: Vec::new(),
            parameters,
            frozen_parameters: 0,
            config: config.clone(),
            predicted_peak_bytes: None,
            predicted_breakdown: None,
            auto: None,
            stopped_at_step: None,
            phases: Vec::new(),
            loader: None,
            host: None,
            communication: None,
            ranks: Vec::new(),
            offload: None,
            offloaded_activations_peak_bytes: None,
            arena: None,
        }
    }

    /// Fills the memory members from the device's statistics.
    pub fn set_memory(&mut self, stats: &DeviceStats) {
        self.memory = MemoryPeaks::of(stats);
    }

    /// Records the loader's figures and the process's resident memory now.
    pub fn set_loader(&mut self, loader: LoaderReport) {
        self.loader = Some(loader);
        self.host = headroom_memory::host::process_memory();
    }

    /// The share of step time spent waiting for data.
    pub fn data_wait_fraction(&self) -> Option<f64> {
        let total: f64 = self.step_times_s.iter().sum();
        let wait = self.loader.as_ref()?.wait_s;
        (total > 0.0).then(|| wait / total)
    }
}
