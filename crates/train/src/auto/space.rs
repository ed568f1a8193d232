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
    let mut micro: Vec<usize> = Vec::new();
    let mut d = 1;
    while d * d <= effective {
        if effective.is_multiple_of(d) {
            micro.push(d);
            if d * d != effective {
                micro.push(effective / d);
            }
        }
        d += 1;
    }
    micro.sort_unstable_by(|a, b| b.cmp(a));
    micro
        .into_iter()
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
    // Each calibration workload stays near CALIBRATION_FLOPS so a wide model is measured in
    // tenths of a second, not minutes: fewer rows, fewer heads, never fewer than 64 rows.
    let rows_for = |k: usize, n: usize| {
        let cap = (CALIBRATION_FLOPS / (6.0 * (k * n) as f64)) as usize;
        (micro_batch * seq_len).min(cap).clamp(64, 4096)
    };
    let activation = |width: usize| (micro_batch * seq_len * width).clamp(1 << 12, 1 << 24);
    match spec {
        ModelSpec::Gpt(c) => {
            let d = c.width / c.heads;
            // Forward 4·T²·D and backward 10·T²·D per head, halved by the causal mask.
            let per_head = 7.0 * (seq_len * seq_len * d) as f64;
            let heads =
                ((CALIBRATION_FLOPS / per_head) as usize).clamp(1, micro_batch.min(4) * c.heads);
            CalibrationShapes {
                matmul: (rows_for(c.width, c.ffn), c.width, c.ffn),
                activation_elements: activation(c.width),
                attention: Some((heads, seq_len, d)),
            }
        }
        ModelSpec::Resmlp(c) => CalibrationShapes {
            matmul: (rows_for(c.width, c.hidden), c.width, c.hidden),
            activation_elements: activation(c.width),
            attention: None,
        },
    }
}

/// FLOPs of one run of a calibration workload (about 10 ms at this machine's f32 rate).
const CALIBRATION_FLOPS: f64 = 1.5e9;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_workloads_stay_small_for_wide_models() {
        let spec = |width: usize, heads: usize, context: usize| {
            ModelSpec::Gpt(headroom_nn::models::gpt::GptConfig {
                vocab: 256,
                context,
                layers: 2,
                width,
                heads,
                ffn: 4 * width,
                dropout: 0.0,
                tied: true,
                attention: Default::default(),
            })
        };
        // gpt-small's shapes are kept whole: 16 × 128 rows, 4 × 4 heads.
        let small = calibration_shapes(&spec(128, 4, 128), 128, 16);
        assert_eq!(small.matmul, (2048, 128, 512));
        assert_eq!(small.activation_elements, 16 * 128 * 128);
        assert_eq!(small.attention, Some((16, 128, 32)));
        // Width 2048 at 1,024 tokens: 1.5e9 / (6 · 2048 · 8192) = 14 rows, raised to 64.
        let wide = calibration_shapes(&spec(2048, 16, 1024), 1024, 8);
        assert_eq!(wide.matmul, (64, 2048, 8192));
        // One head of 1024² × 128 is 9.4e8 FLOPs: one head.
        assert_eq!(wide.attention, Some((1, 1024, 128)));
    }

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
        assert_eq!(splits(1, &Pins::default()), vec![(1, 1)]);
        assert_eq!(splits(49, &Pins::default()), vec![(49, 1), (7, 7), (1, 49)]);
    }
}
