//! The strategies `--auto` searches for headroom's engine: the micro-batch × accumulation splits
//! of the effective batch, and precision × optimizer × checkpoint policy × attention grouped by
//! the planner's fidelity tier — each narrowed to what the user pinned — plus the shapes the
//! speed model is calibrated at.
//!
//! Not for: the search itself (see `auto`).

use super::speed::CalibrationShapes;
use super::{Candidate, Pins};
use crate::config::OptimizerChoice;
use crate::policy::CheckpointPolicy;
use headroom_nn::models::ModelSpec;
use headroom_plan::strategy::{Attention, Precision};

/// Micro-batch × accumulation splits of `effective` allowed by the pins, largest micro-batch
/// first.
pub(crate) fn splits(effective: usize, pins: &Pins) -> Vec<(usize, usize)> {
    (1..=effective)
        .rev()
        .filter(|m| effective.is_multiple_of(*m))
        .map(|m| (m, effective / m))
        .filter(|&(m, _)| pins.micro_batch.is_none_or(|p| p == m))
        .filter(|&(_, a)| pins.accumulation.is_none_or(|p| p == a))
        .collect()
}

/// Precision × optimizer × checkpoint × attention, grouped by fidelity tier (best first). The
/// micro-batch is filled in by the search.
pub(crate) fn combos(spec: &ModelSpec, pins: &Pins) -> Vec<Vec<Candidate>> {
    // fp16-mixed has bf16-mixed's memory and speed with loss scaling on top: only when pinned.
    let precisions = pins.precision.map_or(
        vec![Precision::Fp32, Precision::Bf16Mixed, Precision::Bf16],
        |p| vec![p],
    );
    // AdamW, or its bf16-state variant as a memory lever; other families only when pinned.
    let optimizers = pins.optimizer.map_or(
        vec![OptimizerChoice::Adamw, OptimizerChoice::AdamwBf16],
        |o| vec![o],
    );
    let depth = spec.depth();
    let gpt = matches!(spec, ModelSpec::Gpt(_));
    let checkpoints: Vec<CheckpointPolicy> = match pins.checkpoint {
        Some(c) => vec![c],
        None => {
            let mut v = vec![CheckpointPolicy::None];
            if gpt {
                v.push(CheckpointPolicy::Selective);
            }
            v.extend(
                [4, 2]
                    .into_iter()
                    .filter(|&k| k < depth)
                    .map(CheckpointPolicy::EveryNth),
            );
            if depth >= 9 {
                v.push(CheckpointPolicy::Sqrt);
            }
            v.push(CheckpointPolicy::EveryNth(1));
            v
        }
    };
    // A residual MLP has no attention: the kind changes nothing there.
    let attentions = match (pins.attention, gpt) {
        (Some(a), _) => vec![a],
        (None, true) => vec![Attention::Naive, Attention::MemoryEfficient],
        (None, false) => vec![Attention::Naive],
    };
    let mut tiers: Vec<Vec<Candidate>> = Vec::new();
    for &precision in &precisions {
        for &optimizer in &optimizers {
            for &checkpoint in &checkpoints {
                for &attention in &attentions {
                    let c = Candidate {
                        precision,
                        optimizer,
                        checkpoint,
                        attention,
                        micro_batch: 1,
                        accumulation: 1,
                    };
                    let tier = usize::from(c.fidelity_tier());
                    if tiers.len() <= tier {
                        tiers.resize(tier + 1, Vec::new());
                    }
                    tiers[tier].push(c);
                }
            }
        }
    }
    tiers.retain(|t| !t.is_empty());
    tiers
}

/// The model's largest matmul at the largest micro-batch and its attention head shape.
pub fn calibration_shapes(
    spec: &ModelSpec,
    seq_len: usize,
    micro_batch: usize,
) -> CalibrationShapes {
    let rows = (micro_batch * seq_len).clamp(64, 4096);
    match spec {
        ModelSpec::Gpt(c) => CalibrationShapes {
            matmul: (rows, c.width, c.ffn),
            attention: Some((micro_batch.min(4) * c.heads, seq_len, c.width / c.heads)),
        },
        ModelSpec::Resmlp(c) => CalibrationShapes {
            matmul: (rows, c.width, c.hidden),
            attention: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_keep_the_effective_batch_and_the_pins() {
        let all = splits(12, &Pins::default());
        assert_eq!(all, vec![(12, 1), (6, 2), (4, 3), (3, 4), (2, 6), (1, 12)]);
        let pinned = Pins {
            accumulation: Some(4),
            ..Default::default()
        };
        assert_eq!(splits(12, &pinned), vec![(3, 4)]);
        let impossible = Pins {
            micro_batch: Some(5),
            ..Default::default()
        };
        assert!(splits(12, &impossible).is_empty());
    }
}
