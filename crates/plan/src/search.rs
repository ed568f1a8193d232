//! The search: enumerate the strategy space allowed by the pins and the hardware, evaluate every
//! strategy with the cost model, keep those that fit, and rank them — by fidelity tier first
//! (plans that keep mixed-precision AdamW semantics before those that change the numerics),
//! then by predicted throughput, then by lower peak memory.
//!
//! Not for: explaining the result (see `advice`).

use crate::cost::{Plan, Problem, evaluate};
use crate::error::{PlanError, Result};
use crate::strategy::{
    Attention, Checkpoint, Offload, Optimizer, Pins, Placement, Precision, Strategy, ZeroStage,
};
use serde::Serialize;
use std::cmp::Ordering;

/// Checkpoint policies searched when not pinned.
const CHECKPOINTS: [Checkpoint; 5] = [
    Checkpoint::None,
    Checkpoint::Selective,
    Checkpoint::EveryNth(4),
    Checkpoint::EveryNth(2),
    Checkpoint::ALL_BLOCKS,
];

/// Result of a search.
#[derive(Clone, Debug, Serialize)]
pub struct SearchOutcome {
    /// Strategies evaluated.
    pub evaluated: usize,
    /// Plans that fit, best first.
    pub fitting: Vec<Plan>,
    /// When nothing fits: the plan with the smallest device peak (the closest miss).
    pub closest: Option<Plan>,
}

impl SearchOutcome {
    pub fn recommended(&self) -> Option<&Plan> {
        self.fitting.first()
    }
}

/// Every strategy the pins and the hardware allow.
pub fn enumerate(problem: &Problem, pins: &Pins) -> Result<Vec<Strategy>> {
    let hw = &problem.hardware;
    let world = hw.world_size();
    let has_bf16 = hw.gpu.bf16_tflops > 0.0;
    if let Some(p @ (Precision::Bf16 | Precision::Bf16Mixed)) = pins.precision
        && !has_bf16
    {
        return Err(PlanError::Incompatible(format!(
            "--precision {p} needs bf16 support, which {} lacks; accepted: fp16-mixed, fp32",
            hw.gpu.name
        )));
    }
    let precisions: Vec<Precision> = match pins.precision {
        Some(p) => vec![p],
        None => Precision::ALL
            .iter()
            .copied()
            .filter(|p| has_bf16 || !matches!(p, Precision::Bf16 | Precision::Bf16Mixed))
            // fp16-mixed only where bf16 is missing: same memory and speed, less robust.
            .filter(|p| !has_bf16 || *p != Precision::Fp16Mixed)
            .collect(),
    };
    let optimizers = pins.optimizer.map_or(Optimizer::ALL.to_vec(), |o| vec![o]);
    let stages = pins.zero_stage.map_or(ZeroStage::ALL.to_vec(), |z| vec![z]);
    let offloads = |pin: Option<Offload>| pin.map_or(Offload::ALL.to_vec(), |o| vec![o]);
    let checkpoints = pins.checkpoint.map_or(CHECKPOINTS.to_vec(), |c| vec![c]);
    let attentions = pins.attention.map_or(Attention::ALL.to_vec(), |a| vec![a]);
    let splits = problem.workload.splits(world);
    if splits.is_empty() {
        return Err(PlanError::Batch(
            "no micro-batch × accumulation split matches the pinned values".into(),
        ));
    }

    let mut out = Vec::new();
    let mut first_incompatibility = None;
    for &precision in &precisions {
        for &optimizer in &optimizers {
            for &zero_stage in &stages {
                for &offload_optimizer in &offloads(pins.offload_optimizer) {
                    for &offload_params in &offloads(pins.offload_params) {
                        // One GPU: ZeRO stages without offload all equal stage 0; keep stage 0
                        // plain, stage 2 for optimizer offload, stage 3 for parameter offload,
                        // unless the user pinned the stage.
                        if world == 1 && pins.zero_stage.is_none() {
                            let wanted = if offload_params != Offload::None {
                                3
                            } else if offload_optimizer != Offload::None {
                                2
                            } else {
                                0
                            };
                            if zero_stage.number() != wanted {
                                continue;
                            }
                        }
                        for &checkpoint in &checkpoints {
                            for &attention in &attentions {
                                // Selective recompute only drops the s² scores naive attention keeps.
                                if checkpoint == Checkpoint::Selective
                                    && attention == Attention::MemoryEfficient
                                    && pins.checkpoint.is_none()
                                {
                                    continue;
                                }
                                for &(micro_batch, accumulation) in &splits {
                                    let s = Strategy {
                                        precision,
                                        optimizer,
                                        placement: Placement {
                                            zero_stage,
                                            offload_optimizer,
                                            offload_params,
                                        },
                                        checkpoint,
                                        attention,
                                        micro_batch,
                                        accumulation,
                                    };
                                    match s.incompatibility() {
                                        None => out.push(s),
                                        Some(why) => {
                                            first_incompatibility.get_or_insert(why);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if out.is_empty() {
        return Err(PlanError::Incompatible(
            first_incompatibility.unwrap_or_else(|| "the pinned values leave no strategy".into()),
        ));
    }
    Ok(out)
}

/// Orders fitting plans: fidelity tier, then throughput (higher first); among equal times the
/// plan moving fewer bytes between GPUs (least exposed to the overlap assumption), then the
/// one with the lower peak.
pub fn rank(a: &Plan, b: &Plan) -> Ordering {
    let by = |x: f64, y: f64| x.partial_cmp(&y).unwrap_or(Ordering::Equal);
    a.fidelity_tier
        .cmp(&b.fidelity_tier)
        .then(by(b.time.tokens_per_s, a.time.tokens_per_s))
        .then(by(
            a.time.communication_bytes_per_device,
            b.time.communication_bytes_per_device,
        ))
        .then(
            a.memory
                .per_device_peak_bytes
                .cmp(&b.memory.per_device_peak_bytes),
        )
}

/// Enumerates, evaluates and ranks.
pub fn search(problem: &Problem, pins: &Pins) -> Result<SearchOutcome> {
    let strategies = enumerate(problem, pins)?;
    let evaluated = strategies.len();
    let mut fitting = Vec::new();
    let mut closest: Option<Plan> = None;
    for s in &strategies {
        let plan = evaluate(problem, s);
        if plan.fits {
            fitting.push(plan);
        } else if fitting.is_empty()
            && closest
                .as_ref()
                .is_none_or(|c| plan.memory.per_device_peak_bytes < c.memory.per_device_peak_bytes)
        {
            closest = Some(plan);
        }
    }
    fitting.sort_by(rank);
    if !fitting.is_empty() {
        closest = None;
    }
    Ok(SearchOutcome {
        evaluated,
        fitting,
        closest,
    })
}
