//! The dry run as an evaluator of the planner's search: one strategy of headroom's own engine
//! evaluated by a counted dry run — the memory as the planner reports it (bytes per category at
//! the peak, summing to the peak reserved) and the step time of the measured speed model. Each
//! dry run's prediction is kept, so the run that follows the search reuses it.
//!
//! Not for: which values to try (see `space`) or the search itself (the planner's `search`).

use super::space::engine_space;
use super::speed::{SpeedModel, UpdateKind};
use crate::config::{ConfigError, RunConfig};
use crate::data::Corpus;
use crate::predict::{Prediction, dry_run_counted};
use crate::trainer::{TrainError, model_spec};
use headroom_memory::{Category, MemoryBreakdown};
use headroom_nn::models::ModelSpec;
use headroom_plan::cost::{MemoryPrediction, Plan, memory::Phase};
use headroom_plan::search::{Evaluator, Space};
use headroom_strategy::{Pins, Strategy, batch_splits};
use std::collections::HashMap;
use std::sync::Mutex;

/// Dry runs of `config`'s model and data under other strategies, timed by `speed`.
#[derive(Debug)]
pub struct DryRunEvaluator<'a> {
    pub config: &'a RunConfig,
    pub corpus: &'a Corpus,
    pub spec: ModelSpec,
    pub speed: SpeedModel,
    /// Sequences per optimizer step that every split keeps.
    pub effective_batch: u64,
    predictions: Mutex<HashMap<Strategy, Prediction>>,
}

impl<'a> DryRunEvaluator<'a> {
    pub fn new(
        config: &'a RunConfig,
        corpus: &'a Corpus,
        spec: ModelSpec,
        speed: SpeedModel,
        effective_batch: u64,
    ) -> Self {
        DryRunEvaluator {
            config,
            corpus,
            spec,
            speed,
            effective_batch,
            predictions: Mutex::new(HashMap::new()),
        }
    }

    /// The dry run of a strategy this evaluator evaluated.
    pub fn prediction(&self, strategy: &Strategy) -> Option<Prediction> {
        let cache = self.predictions.lock().expect("no evaluation panicked");
        cache.get(strategy).cloned()
    }
}

impl Evaluator for DryRunEvaluator<'_> {
    type Error = TrainError;

    fn space(&self, pins: &Pins) -> Result<Space, TrainError> {
        let splits = batch_splits(self.effective_batch, pins.micro_batch, pins.accumulation);
        if splits.is_empty() {
            let pinned = |v: Option<u64>| v.map_or("any".to_string(), |v| v.to_string());
            return Err(TrainError::Config(ConfigError::Value {
                key: "micro_batch",
                value: format!(
                    "{} × accumulation {}",
                    pinned(pins.micro_batch),
                    pinned(pins.accumulation)
                ),
                reason: format!(
                    "no such split of the effective batch of {}; pin a divisor of it",
                    self.effective_batch
                ),
            }));
        }
        Ok(Space {
            splits,
            ..engine_space(&self.spec, pins, self.config.data_parallel)
        })
    }

    fn evaluate(&self, strategy: &Strategy) -> Result<Plan, TrainError> {
        let (plan, prediction) = evaluate(self.config, self.corpus, strategy, &self.speed)?;
        let mut cache = self.predictions.lock().expect("no evaluation panicked");
        cache.insert(*strategy, prediction);
        Ok(plan)
    }

    /// Dry runs take milliseconds each: tiers in order, splits by bisection.
    fn exhaustive(&self) -> bool {
        false
    }

    /// Only what the engine runs: not 8-bit states or Adafactor under ZeRO in a group (the
    /// shards would cut their blocks or weights; the trainer refuses them).
    fn worth_trying(&self, strategy: &Strategy, _pins: &Pins) -> bool {
        use headroom_strategy::Optimizer as O;
        let whole_tensors = matches!(
            strategy.optimizer,
            O::AdamW8bit | O::PagedAdamW8bit | O::Adafactor
        );
        let cut = whole_tensors
            && self.config.data_parallel > 1
            && strategy.placement.zero_stage.shards_optimizer();
        strategy.incompatibility().is_none() && !cut
    }
}

/// Dry-runs `strategy` on `config` (its other settings) and predicts its step time; returns the
/// plan and the dry run's prediction.
pub fn evaluate(
    config: &RunConfig,
    corpus: &Corpus,
    strategy: &Strategy,
    speed: &SpeedModel,
) -> Result<(Plan, Prediction), TrainError> {
    let run = config.with_strategy(*strategy);
    let spec = model_spec(&run)?;
    let seq_len = run.seq_len_of(&spec);
    let dry = dry_run_counted(&run, corpus)?;
    let p = dry.prediction;
    let m = &p.memory;
    let mut at_peak = m.breakdown.at_peak;
    // What the allocator reserved beyond the live tensors (cached and split blocks) is the
    // planner's `Other`, so the categories sum to the peak reserved.
    at_peak[Category::Other] += m.peak_reserved_bytes.saturating_sub(m.peak_allocated_bytes);
    let tokens = (run.batch_per_rank() * seq_len) as f64;
    // The rank updates its shard of every block under ZeRO, every parameter otherwise.
    let update = match strategy.optimizer {
        headroom_strategy::Optimizer::Adafactor => UpdateKind::Adafactor,
        _ => UpdateKind::Adam(crate::trainer::optimizer_state_dtype(&run)?),
    };
    let params = spec.num_params() as f64;
    let updated = match (
        run.data_parallel,
        strategy.placement.zero_stage.shards_optimizer(),
    ) {
        (1, _) | (_, false) => params,
        (n, true) => (params / n as f64).ceil(),
    };
    let plan = Plan {
        strategy: *strategy,
        fits: p.fits,
        memory: MemoryPrediction {
            per_device_peak_bytes: at_peak.total(),
            breakdown: MemoryBreakdown {
                at_peak,
                steady: m.breakdown.steady,
            },
            peak_phase: if m.breakdown.at_peak[Category::Activation] > 0 {
                Phase::ForwardBackward
            } else {
                Phase::OptimizerStep
            },
            capacity_bytes: config.device_memory,
            usable_bytes: config.device_memory,
            host_bytes_per_node: 0,
            nvme_bytes_per_node: 0,
        },
        time: speed.step_time_with_update(&dry.step_work, tokens, update, updated),
        fidelity_tier: strategy.fidelity_tier(),
    };
    Ok((plan, p))
}
