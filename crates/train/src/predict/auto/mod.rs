//! Planning headroom's own runs: the fastest strategy that fits a device budget, found by dry
//! runs (exact memory, fragmentation included) and a measured speed model (step time from the
//! dry run's counted work). `headroom plan` prints the result for a headroom model;
//! `headroom train --auto` runs the recommended strategy.
//!
//! The search is the planner's (`headroom_plan::search`), with the effective batch
//! (micro-batch × accumulation) fixed, pinned levers held and the configured strategy winning
//! near ties; the dry run is its evaluator here (fidelity tiers in order, the largest fitting
//! micro-batch by bisection).
//!
//! Layout: `space` (what is tried), `evaluator` (one strategy evaluated by a counted dry run),
//! `speed` (the measured speed model; `step_rates` its update and host-copy rates), `arena` (the planned arena as a lever), this module (the
//! search's outcome and its reason).
//!
//! Not for: other models (the planner's analytical model covers Hugging Face configs).

pub mod arena;
pub mod evaluator;
pub mod space;
pub mod speed;
pub mod step_rates;

pub use evaluator::{DryRunEvaluator, evaluate};
pub use space::calibration_shapes;
pub use speed::{CalibrationShapes, SpeedModel, StepTime};

use crate::config::RunConfig;
use crate::data::Corpus;
use crate::predict::Prediction;
use crate::trainer::{TrainError, model_spec};
use headroom_memory::{AllocatorKind, format_bytes};
use headroom_plan::cost::Plan;
use headroom_plan::search::{SAME_SPEED, SearchOutcome, search};
use headroom_strategy::{Pins, batch_splits};
use std::time::Instant;

/// The outcome of a search.
#[derive(Clone, Debug)]
pub struct AutoPlan {
    /// Plans that fit (best first), those that did not, the closest miss.
    pub search: SearchOutcome,
    /// The dry run of the recommended plan, for the run that follows.
    pub recommended_prediction: Option<Prediction>,
    pub speed: SpeedModel,
    pub effective_batch: usize,
    pub seq_len: usize,
    /// Whether the model has attention (the residual MLP has none: its plans name no kind).
    pub has_attention: bool,
    /// The device allocator the recommended plan runs with (the plans were dry-run on it).
    pub allocator: AllocatorKind,
    /// Why that allocator, when the search compared several (see [`plan`]).
    pub allocator_reason: Option<String>,
    /// Seconds the search took (calibration and dry runs).
    pub seconds: f64,
}

impl AutoPlan {
    pub fn recommended(&self) -> Option<&Plan> {
        self.search.recommended()
    }

    /// Dry runs made.
    pub fn evaluated(&self) -> usize {
        self.search.evaluated
    }

    /// When nothing fits: the plan with the lowest peak.
    pub fn closest(&self) -> Option<&Plan> {
        self.search.closest.as_ref()
    }

    /// One or two lines: the choice, and what a faster plan would have needed.
    pub fn reason(&self, budget: u64) -> String {
        let Some(best) = self.recommended() else {
            let closest = self.closest().map_or(0, |p| p.memory.per_device_peak_bytes);
            return format!(
                "no strategy fits {}: the smallest of {} dry runs fits in {}",
                format_bytes(budget),
                self.evaluated(),
                format_bytes(closest)
            );
        };
        let which = if self.search.recommends_the_fastest() {
            "the fastest".to_string()
        } else {
            format!(
                "within {:.0} % of the fastest, and the closest to the configuration,",
                100.0 * SAME_SPEED
            )
        };
        let mut out = format!(
            "{} — {which} of {} dry-run strategies that fit {} (predicted {:.0} tokens/s, peak {})",
            best.strategy.describe(self.has_attention),
            self.search.fitting.len(),
            format_bytes(budget),
            best.time.tokens_per_s,
            format_bytes(best.memory.per_device_peak_bytes)
        );
        if let Some(why) = &self.allocator_reason {
            out += &format!("\n  {why}");
        }
        if let Some(f) = self.search.faster_over_budget() {
            out += &format!(
                "\n  faster but over the budget: {}, which fits in {} ({:.0} tokens/s)",
                f.strategy.describe(self.has_attention),
                format_bytes(f.memory.per_device_peak_bytes),
                f.time.tokens_per_s
            );
        }
        out
    }
}

/// Searches the strategies `pins` leave open for the fastest that fits `config.device_memory`.
/// The effective batch is `config`'s (or the pinned micro-batch × accumulation). Unless the
/// allocator is pinned, plans that miss only by the caching pools' overhead are retried on the
/// planned arena (see [`arena`]).
pub fn plan(config: &RunConfig, corpus: &Corpus, pins: &Pins) -> Result<AutoPlan, TrainError> {
    let started = Instant::now();
    let spec = model_spec(config)?;
    let seq_len = config.seq_len_of(&spec);
    let effective_batch = match (pins.micro_batch, pins.accumulation) {
        (Some(m), Some(a)) => m.saturating_mul(a),
        _ => config.batch_per_rank() as u64,
    };
    // The speed model is calibrated at the largest micro-batch the search may try.
    let largest = batch_splits(effective_batch, pins.micro_batch, pins.accumulation)
        .first()
        .map_or(1, |&(m, _)| m as usize);
    let mut shapes = calibration_shapes(&spec, seq_len, largest);
    if config.data_parallel > 1 {
        // A block's flat buffer is a few of the largest matmul's weights (a GPT block 12·w²,
        // its FFN weight 4·w²).
        let (_, k, n) = shapes.matmul;
        shapes.collectives = Some((config.data_parallel, (3 * k * n).clamp(1 << 12, 1 << 22)));
    }
    let speed = SpeedModel::measure(shapes)?;
    let has_attention = spec.attention_heads().is_some();
    let evaluator = DryRunEvaluator::new(config, corpus, spec, speed, effective_batch);
    let mut outcome = search(&evaluator, pins, Some(&config.strategy))?;
    let mut recommended_prediction = outcome
        .recommended()
        .and_then(|p| evaluator.prediction(&p.strategy));
    let (mut allocator, mut allocator_reason) = (config.allocator, None);
    if pins.allocator.is_none() && config.allocator != AllocatorKind::Planned {
        let peak_live = |s: &headroom_strategy::Strategy| {
            evaluator
                .prediction(s)
                .map_or(u64::MAX, |p| p.memory.peak_allocated_bytes)
        };
        if let Some(rescued) = arena::rescue(config, corpus, &speed, &mut outcome, peak_live)? {
            allocator = AllocatorKind::Planned;
            allocator_reason = Some(rescued.reason(has_attention));
            recommended_prediction = Some(rescued.prediction);
        }
    }
    Ok(AutoPlan {
        search: outcome,
        recommended_prediction,
        speed,
        effective_batch: effective_batch as usize,
        seq_len,
        has_attention,
        allocator,
        allocator_reason,
        seconds: started.elapsed().as_secs_f64(),
    })
}
