//! The strategies `--auto` searches for headroom's engine: precision × optimizer × checkpoint
//! policy × attention × loss grouped by fidelity tier — each narrowed to what the user pinned — plus
//! the shapes the speed model is calibrated at.
//!
//! Not for: the search itself (the planner's `search`, shared with the analytical model).

use super::speed::CalibrationShapes;
use headroom_nn::models::ModelSpec;
use headroom_plan::search::{Space, in_backward_values};
use headroom_strategy::{
    Attention, Checkpoint, Loss, Offload, Optimizer, Pins, Placement, Precision, ZeroStage,
};

/// The values `--auto` tries on each axis for `spec` on `world` data-parallel ranks (pinned
/// values replace them; the search applies the pins and groups by fidelity tier). `splits` are
/// filled in by the caller.
pub(crate) fn engine_space(spec: &ModelSpec, pins: &Pins, world: usize) -> Space {
    // fp16-mixed has bf16-mixed's memory and speed with loss scaling on top: only when pinned.
    let precisions = pins.precision.map_or(
        vec![Precision::Fp32, Precision::Bf16Mixed, Precision::Bf16],
        |p| vec![p],
    );
    // AdamW, or its bf16- and 8-bit-state variants, paged 8-bit states and Adafactor as memory
    // levers (the speed model times each one's update, and the pages' copies); other families
    // only when pinned.
    let optimizers = pins.optimizer.map_or(
        vec![
            Optimizer::AdamW,
            Optimizer::AdamWBf16,
            Optimizer::AdamW8bit,
            Optimizer::PagedAdamW8bit,
            Optimizer::Adafactor,
        ],
        |o| vec![o],
    );
    let depth = spec.depth() as u64;
    // A transformer (GPT, Llama family) has attention to choose and recompute selectively.
    let transformer = spec.attention_heads().is_some();
    let checkpoints: Vec<Checkpoint> = match pins.checkpoint {
        Some(c) => vec![c],
        None => {
            let mut v = vec![Checkpoint::None];
            if transformer {
                v.push(Checkpoint::Selective);
            }
            v.extend(
                [4, 2]
                    .into_iter()
                    .filter(|&k| k < depth)
                    .map(Checkpoint::EveryNth),
            );
            if depth >= 9 {
                v.push(Checkpoint::Sqrt);
            }
            v.push(Checkpoint::ALL_BLOCKS);
            v
        }
    };
    // A residual MLP has no attention: the kind changes nothing there.
    let attentions = match (pins.attention, transformer) {
        (Some(a), _) => vec![a],
        (None, true) => vec![Attention::Naive, Attention::MemoryEfficient],
        (None, false) => vec![Attention::Naive],
    };
    // With several ranks, model states may be sharded
    // (ZeRO-1, 2, 3): each stage lowers a rank's memory, and its collectives are timed by the
    // speed model (ZeRO-3 sends 3Ψ where the others send 2Ψ), so a stage is chosen when it fits
    // where a lower one does not, or when it is faster.
    // Host memory as a tier: checkpointed blocks' inputs (GPTs and MLPs alike) and the
    // optimizer's states and master weights under a ZeRO stage, each copied at the measured
    // host-copy rate (the dry run counts the bytes). The disk tier and parameter offload only
    // when pinned: the speed model does not time disk transfers, and parameter offload needs
    // ZeRO-3 with several ranks.
    let activation_offloads = pins
        .offload_activations
        .map_or(vec![Offload::None, Offload::Cpu], |o| vec![o]);
    let optimizer_offloads = pins
        .offload_optimizer
        .map_or(vec![Offload::None, Offload::Cpu], |o| vec![o]);
    let stages: Vec<ZeroStage> = match (pins.zero_stage, world > 1) {
        (Some(stage), _) => vec![stage],
        (None, true) => (0..=3)
            .map(|n| ZeroStage::new(n).expect("stages 0 to 3 exist"))
            .collect(),
        // One rank: stage 1 shards nothing, but it is how ZeRO-Offload runs on one device.
        (None, false) => vec![
            ZeroStage::default(),
            ZeroStage::new(1).expect("stage 1 exists"),
        ],
    };
    let mut placements = Vec::new();
    for &zero_stage in &stages {
        for &offload_optimizer in &optimizer_offloads {
            if pins.zero_stage.is_none()
                && world == 1
                && zero_stage.shards_optimizer()
                && !offload_optimizer.is_offloaded()
            {
                continue;
            }
            for &offload_activations in &activation_offloads {
                let p = Placement {
                    zero_stage,
                    offload_optimizer,
                    offload_params: pins.offload_params.unwrap_or_default(),
                    offload_activations,
                };
                // Offload without a ZeRO stage is no placement (a pinned one was refused when
                // the configuration was read).
                if p.incompatibility().is_none() {
                    placements.push(p);
                }
            }
        }
    }
    // The plain loss, or chunked:8 where the logits are what does not fit (the dry run times
    // the recomputed projection).
    let losses = pins.loss.map_or(Loss::SEARCHED.to_vec(), |l| vec![l]);
    Space {
        precisions,
        optimizers,
        placements,
        checkpoints,
        attentions,
        losses,
        in_backward: in_backward_values(pins, world as u64),
        splits: Vec::new(),
    }
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
    let (width, ffn) = spec.mlp_widths();
    let attention = spec.attention_heads().map(|(heads, d)| {
        // Forward 4·T²·D and backward 10·T²·D per head, halved by the causal mask.
        let per_head = 7.0 * (seq_len * seq_len * d) as f64;
        let heads = ((CALIBRATION_FLOPS / per_head) as usize).clamp(1, micro_batch.min(4) * heads);
        (heads, seq_len, d)
    });
    CalibrationShapes {
        matmul: (rows_for(width, ffn), width, ffn),
        activation_elements: activation(width),
        attention,
        collectives: None,
    }
}

/// FLOPs of one run of a calibration workload (about 10 ms at this machine's f32 rate).
const CALIBRATION_FLOPS: f64 = 1.5e9;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_levers_are_searched_unless_pinned() {
        let spec = headroom_nn::models::preset("gpt-tiny").expect("a preset");
        let space = engine_space(&spec, &Pins::default(), 1);
        assert!(space.optimizers.contains(&Optimizer::PagedAdamW8bit));
        let has = |p: &Placement, stage: u8, optimizer: Offload, activations: Offload| {
            p.zero_stage.number() == stage
                && p.offload_optimizer == optimizer
                && p.offload_activations == activations
        };
        // One rank: local, activations offloaded, and ZeRO-1 only as ZeRO-Offload's vehicle.
        let placements = &space.placements;
        assert_eq!(placements.len(), 4);
        for (stage, o, a) in [
            (0, Offload::None, Offload::None),
            (0, Offload::None, Offload::Cpu),
            (1, Offload::Cpu, Offload::None),
            (1, Offload::Cpu, Offload::Cpu),
        ] {
            assert!(
                placements.iter().any(|p| has(p, stage, o, a)),
                "{stage} {o} {a}"
            );
        }
        // Pins replace the values: a pinned stage on one rank is kept even without offload.
        let pins = Pins {
            zero_stage: ZeroStage::new(1).ok(),
            offload_optimizer: Some(Offload::None),
            offload_activations: Some(Offload::None),
            optimizer: Some(Optimizer::AdamW),
            ..Pins::default()
        };
        let pinned = engine_space(&spec, &pins, 1);
        assert_eq!(pinned.optimizers, vec![Optimizer::AdamW]);
        assert_eq!(pinned.placements.len(), 1);
        assert!(has(&pinned.placements[0], 1, Offload::None, Offload::None));
        // Two ranks: every stage with and without activation offload, optimizer offload from
        // stage 1 on (2 + 3 × 4).
        assert_eq!(
            engine_space(&spec, &Pins::default(), 2).placements.len(),
            14
        );
    }

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
                lora: None,
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
}
