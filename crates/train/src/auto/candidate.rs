//! One strategy for headroom's own engine — precision, optimizer, checkpoint policy, attention,
//! micro-batch × accumulation — and its evaluation by a counted dry run: the memory as the
//! planner reports it (bytes per category at the peak, summing to the peak reserved) and the
//! step time of the speed model.
//!
//! Not for: which strategies to try (see `space`) or choosing among them (see `auto`).

use super::speed::{SpeedModel, StepTime};
use crate::config::{OptimizerChoice, RunConfig};
use crate::data::Corpus;
use crate::policy::{CheckpointPolicy, recompute_for};
use crate::predict::dry_run_counted;
use crate::trainer::{PrecisionPlan, TrainError, model_spec};
use headroom_memory::Category;
use headroom_plan::cost::{MemoryPrediction, fidelity_tier, memory::Phase};
use headroom_plan::strategy::{self, Attention, Checkpoint, Offload, Precision, Strategy};
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

/// A strategy the single-device engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub precision: Precision,
    pub optimizer: OptimizerChoice,
    pub checkpoint: CheckpointPolicy,
    pub attention: Attention,
    pub micro_batch: usize,
    pub accumulation: usize,
}

impl Candidate {
    /// The strategy `config` runs as configured.
    pub fn of(config: &RunConfig) -> Candidate {
        Candidate {
            precision: config.precision(),
            optimizer: config.optimizer,
            checkpoint: config.checkpoint_policy(),
            attention: config.attention_kind(),
            micro_batch: config.micro_batch,
            accumulation: config.accumulation,
        }
    }

    /// `config` running this strategy.
    pub fn apply(&self, config: &RunConfig) -> RunConfig {
        RunConfig {
            precision: self.precision.to_string(),
            optimizer: self.optimizer,
            checkpoint: self.checkpoint.to_string(),
            attention: self.attention.to_string(),
            micro_batch: self.micro_batch,
            accumulation: self.accumulation,
            ..config.clone()
        }
    }

    /// The planner's optimizer of the same name.
    pub fn planner_optimizer(&self) -> strategy::Optimizer {
        match self.optimizer {
            OptimizerChoice::Sgd => strategy::Optimizer::Sgd,
            OptimizerChoice::SgdMomentum => strategy::Optimizer::SgdMomentum,
            OptimizerChoice::Adamw => strategy::Optimizer::AdamW,
            OptimizerChoice::AdamwBf16 => strategy::Optimizer::AdamWBf16,
            OptimizerChoice::Lamb => strategy::Optimizer::Lamb,
        }
    }

    /// How far the numerics depart from mixed-precision AdamW, as the planner ranks it.
    pub fn fidelity_tier(&self) -> u8 {
        fidelity_tier(&Strategy {
            precision: self.precision,
            optimizer: self.planner_optimizer(),
            zero_stage: 0,
            offload_optimizer: Offload::None,
            offload_params: Offload::None,
            // Neither changes the tier.
            checkpoint: Checkpoint::None,
            attention: self.attention,
            micro_batch: self.micro_batch as u64,
            accumulation: self.accumulation as u64,
        })
    }

    /// `fp32, adamw, checkpoint none, naive attention, micro-batch 16 × 1` (without the
    /// attention for a model that has none).
    pub fn describe(&self, has_attention: bool) -> String {
        let attention = if has_attention {
            format!(", {} attention", self.attention)
        } else {
            String::new()
        };
        format!(
            "{}, {}, checkpoint {}{attention}, micro-batch {} × {}",
            self.precision,
            self.planner_optimizer(),
            self.checkpoint,
            self.micro_batch,
            self.accumulation
        )
    }
}

/// Serialised with the keys of the planner's `Strategy` (a single device: ZeRO stage 0, no
/// offload).
impl Serialize for Candidate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Strategy", 9)?;
        st.serialize_field("precision", &self.precision)?;
        st.serialize_field("optimizer", &self.planner_optimizer())?;
        st.serialize_field("zero_stage", &0u8)?;
        st.serialize_field("offload_optimizer", &Offload::None)?;
        st.serialize_field("offload_params", &Offload::None)?;
        st.serialize_field("checkpoint", &self.checkpoint.to_string())?;
        st.serialize_field("attention", &self.attention)?;
        st.serialize_field("micro_batch", &self.micro_batch)?;
        st.serialize_field("accumulation", &self.accumulation)?;
        st.end()
    }
}

/// A strategy with its dry-run memory and its predicted time, shaped as the planner's `Plan`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OwnPlan {
    pub strategy: Candidate,
    /// A dry run under the device budget completes.
    pub fits: bool,
    pub memory: MemoryPrediction,
    pub time: StepTime,
    pub fidelity_tier: u8,
}

/// Dry-runs `candidate` on `config` (its other settings) and predicts its step time.
pub fn evaluate(
    config: &RunConfig,
    corpus: &Corpus,
    candidate: &Candidate,
    speed: &SpeedModel,
) -> Result<OwnPlan, TrainError> {
    let run = candidate.apply(config);
    let spec = model_spec(&run)?;
    let seq_len = run.seq_len.unwrap_or_else(|| spec.default_seq_len());
    let dtype = PrecisionPlan::of(candidate.precision).compute;
    let (recompute, _) = recompute_for(
        candidate.checkpoint,
        &spec,
        dtype,
        candidate.micro_batch,
        seq_len,
    )?;
    let dry = dry_run_counted(&run, corpus, &recompute)?;
    let p = &dry.prediction;
    let mut by_category = p.bytes_at_peak_by_category;
    // What the allocator reserved beyond the live tensors (cached and split blocks) is the
    // planner's `Other`, so the categories sum to the peak reserved.
    by_category[Category::Other] += p.peak_reserved_bytes.saturating_sub(p.peak_allocated_bytes);
    let tokens = (candidate.micro_batch * candidate.accumulation * seq_len) as f64;
    Ok(OwnPlan {
        strategy: *candidate,
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
        fidelity_tier: candidate.fidelity_tier(),
    })
}
