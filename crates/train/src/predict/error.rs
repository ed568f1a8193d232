//! Predicted against measured: a matrix of headroom runs (GPT and residual MLP × precision ×
//! micro-batch × accumulation × checkpoint policy × attention), each run for real, dry-run, and
//! costed by the planner's analytical model, so the error of both predictions is known.
//! `headroom bench predict` prints it; the prediction test asserts the dry run's part.
//!
//! Not for: choosing strategies (see `auto`).

use crate::config::{RunConfig, TrainConfig};
use crate::data::Corpus;
use crate::predict::analytical::analytical_memory;
use crate::predict::predict;
use crate::predict::prepare::{PreparedRun, arena_layouts};
use crate::trainer::{TrainError, Trainer};
use headroom_memory::{Category, Device, MemoryBreakdown, MemoryPeaks};
use headroom_strategy::{Attention, Checkpoint, Precision};
use serde::Serialize;

/// The 32 configurations: two of every three of the 48 combinations of model (gpt-tiny,
/// resmlp) × precision (4) × (micro-batch, accumulation) ∈ {(2, 1), (4, 2)} × checkpoint
/// (none, all, every:2); the GPT alternates naive and memory-efficient attention.
pub fn matrix() -> Vec<TrainConfig> {
    let mut out = Vec::new();
    let precisions = Precision::ALL;
    let policies = [
        Checkpoint::None,
        Checkpoint::ALL_BLOCKS,
        Checkpoint::EveryNth(2),
    ];
    // Group g (one model, precision and split) leaves out policy g mod 3, and on the GPT uses
    // memory-efficient attention when g is even: every policy meets both attention kinds.
    let mut group = 0usize;
    for model in ["gpt-tiny", "resmlp"] {
        for precision in precisions {
            for (micro, accumulation) in [(2, 1), (4, 2)] {
                let attention = if model == "gpt-tiny" && group.is_multiple_of(2) {
                    Attention::MemoryEfficient
                } else {
                    Attention::Naive
                };
                for (k, checkpoint) in policies.into_iter().enumerate() {
                    if k == group % 3 {
                        continue;
                    }
                    out.push(TrainConfig {
                        model: Some(model.into()),
                        precision: Some(*precision),
                        micro_batch: Some(micro),
                        accumulation: Some(accumulation),
                        checkpoint: Some(checkpoint),
                        attention: Some(attention),
                        seq_len: Some(32),
                        steps: Some(3),
                        eval_every: Some(0),
                        eval_batches: Some(1),
                        device_memory: Some("256MiB".parse().expect("a size")),
                        seed: Some(3),
                        ..Default::default()
                    });
                }
                group += 1;
            }
        }
    }
    out
}

/// One configuration's three sets of figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PredictionError {
    /// `gpt-tiny fp32 2×1 none naive`.
    pub label: String,
    pub measured: MemoryPeaks,
    pub dry_run: MemoryPeaks,
    /// The analytical model's figures: its allocated bytes at the peak (no fragmentation
    /// reserve), its peak with the reserve as the reserved peak, and as the activations' own
    /// peak the bytes held at the start of backward.
    pub analytical: MemoryPeaks,
}

/// Relative error of `predicted` against `measured`.
pub fn relative_error(predicted: u64, measured: u64) -> f64 {
    (predicted as f64 - measured as f64) / (measured as f64).max(1.0)
}

/// Runs `config` for real, dry-runs it and costs it analytically.
pub fn evaluate(config: TrainConfig, corpus: &Corpus) -> Result<PredictionError, TrainError> {
    let run: RunConfig = config.resolve()?;
    let s = &run.strategy;
    let label = format!(
        "{} {} {}×{} {} {}",
        run.model, s.precision, s.micro_batch, s.accumulation, s.checkpoint, s.attention
    );
    let dry = predict(&run, corpus)?;
    let prepared = PreparedRun {
        config: run.clone(),
        auto: None,
        found_micro_batch: None,
        prediction: dry.clone(),
        arena_layouts: arena_layouts(&run, corpus)?,
    };
    let device = Device::cpu(run.device_memory, run.allocator.config());
    let mut trainer = Trainer::prepared(&prepared, corpus, device, None)?;
    let measured = trainer.train(&mut |_| {})?.clone();
    let a = analytical_memory(&run)?;
    let mut allocated = a.memory.breakdown.at_peak;
    allocated[Category::Other] = 0;
    let mut own = allocated;
    own[Category::Activation] = a.activation_bytes;
    Ok(PredictionError {
        label,
        measured: measured.memory,
        dry_run: dry.memory,
        analytical: MemoryPeaks {
            peak_allocated_bytes: allocated.total(),
            peak_reserved_bytes: a.memory.per_device_peak_bytes,
            breakdown: MemoryBreakdown {
                at_peak: allocated,
                steady: a.memory.breakdown.steady,
            },
            peak_bytes_by_category: own,
        },
    })
}
