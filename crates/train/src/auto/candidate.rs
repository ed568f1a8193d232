//! The evaluation of one strategy on headroom's own engine by a counted dry run: the memory as the
//! planner reports it (bytes per category at the peak, summing to the peak reserved) and the
//! step time of the speed model.
//!
//! Not for: which strategies to try (see `space`) or choosing among them (see `auto`).

use super::speed::{SpeedModel, StepTime};
use crate::config::RunConfig;
use crate::data::Corpus;
use crate::predict::dry_run_counted;
use crate::trainer::{TrainError, model_spec};
use headroom_memory::Category;
use headroom_plan::cost::{MemoryPrediction, memory::Phase};
use headroom_strategy::Strategy;
use serde::Serialize;

/// A strategy with its dry-run memory and its predicted time, shaped as the planner's `Plan`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OwnPlan {
    pub strategy: Strategy,
    /// A dry run under the device budget completes.
    pub fits: bool,
    pub memory: MemoryPrediction,
    pub time: StepTime,
    pub fidelity_tier: u8,
    /// The dry run behind `memory`, reused when this plan is the one that runs.
    #[serde(skip)]
    pub prediction: crate::predict::Prediction,
}

/// Dry-runs `strategy` on `config` (its other settings) and predicts its step time.
pub fn evaluate(
    config: &RunConfig,
    corpus: &Corpus,
    strategy: &Strategy,
    speed: &SpeedModel,
) -> Result<OwnPlan, TrainError> {
    let run = config.with_strategy(*strategy);
    let spec = model_spec(&run)?;
    let seq_len = run.seq_len.unwrap_or_else(|| spec.default_seq_len());
    let dry = dry_run_counted(&run, corpus)?;
    let p = &dry.prediction;
    let mut by_category = p.bytes_at_peak_by_category;
    // What the allocator reserved beyond the live tensors (cached and split blocks) is the
    // planner's `Other`, so the categories sum to the peak reserved.
    by_category[Category::Other] += p.peak_reserved_bytes.saturating_sub(p.peak_allocated_bytes);
    let tokens = (run.effective_batch() * seq_len) as f64;
    Ok(OwnPlan {
        strategy: *strategy,
        fits: p.fits,
        memory: MemoryPrediction {
            per_device_peak_bytes: by_category.total(),
            by_category,
            steady_by_category: dry.steady_bytes_by_category,
            peak_phase: if p.bytes_at_peak_by_category[Category::Activation] > 0 {
                Phase::ForwardBackward
            } else {
                Phase::OptimizerStep
            },
            capacity_bytes: config.device_memory,
            usable_bytes: config.device_memory,
            host_bytes_per_node: 0,
            nvme_bytes_per_node: 0,
        },
        time: speed.step_time(&dry.step_work, tokens),
        fidelity_tier: strategy.fidelity_tier(),
        prediction: dry.prediction.clone(),
    })
}
