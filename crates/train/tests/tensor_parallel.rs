//! Tensor parallelism in the engine (`--tensor-parallel N`, Megatron-LM's split): a GPT split
//! over 2 and 4 ranks (threads, launched as `headroom train` launches them) trains bitwise as
//! the unsplit run in deterministic mode, in fp32 and bf16-mixed; each rank's weights after
//! training are bitwise its slice of the unsplit weights; the dry run predicts every rank's
//! peak and categories exactly; the combinations it cannot run are refused by name.

use crate::common;

use common::launched;
use headroom_memory::MemoryPeaks;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::launch::{Inspect, LaunchOptions};
use headroom_train::strategy::{Optimizer, Precision};
use std::sync::Arc;

/// gpt-tiny (2 layers, width 32, MLP 128) with 4 heads so that 4 ranks split it, 4 steps of
/// micro-batch 2, AdamW with clipping at norm 1 (the default), deterministic.
fn config(tp: Option<usize>, precision: Precision) -> RunConfig {
    TrainConfig {
        deterministic: Some(true),
        model: Some("gpt-tiny".into()),
        heads: Some(4),
        seq_len: Some(16),
        dropout: Some(0.0),
        precision: Some(precision),
        optimizer: Some(Optimizer::AdamW),
        micro_batch: Some(2),
        accumulation: Some(1),
        tensor_parallel: tp,
        steps: Some(4),
        warmup_steps: Some(1),
        eval_every: Some(0),
        eval_batches: Some(1),
        device_memory: Some("256MiB".parse().unwrap()),
        seed: Some(11),
        ..Default::default()
    }
    .resolve()
    .unwrap()
}

/// A rank's run: its losses (bits), each block's name, slots (name, shape, offset) and weights
/// as f32 bits, and its memory.
struct Rank {
    losses: Vec<u64>,
    blocks: Vec<Block>,
    memory: MemoryPeaks,
    parameters: u64,
}

/// A block's name, its slots (name, shape, offset) and its weights as f32 bits.
type Block = (String, Vec<(String, Vec<usize>, usize)>, Vec<u32>);

fn run(c: &RunConfig) -> Vec<Rank> {
    let inspect: Inspect<Rank> = Arc::new(|t| {
        let losses = t.report().losses.iter().map(|l| l.to_bits()).collect();
        let values = t.parameters_f32()?;
        let mut offset = 0;
        let blocks = t
            .model()
            .blocks()
            .iter()
            .map(|b| {
                let specs = b
                    .specs()
                    .iter()
                    .map(|s| (s.name.clone(), s.shape.clone(), s.offset))
                    .collect();
                let v = values[offset..offset + b.numel()]
                    .iter()
                    .map(|x| x.to_bits())
                    .collect();
                offset += b.numel();
                (b.name().to_string(), specs, v)
            })
            .collect();
        Ok(Rank {
            losses,
            blocks,
            memory: t.report().memory,
            parameters: t.model().num_params() as u64,
        })
    });
    launched(c, LaunchOptions::default(), inspect)
}

/// Rank r of t's part of an unsplit slot `name` of `shape` (row-major `values`), by Megatron-LM's
/// split: q/k/v's and the MLP's first weight (and their biases) by columns — rank r's heads of
/// each of q, k and v — the two output projections by rows, everything else whole.
fn slice(name: &str, shape: &[usize], values: &[u32], r: usize, t: usize) -> Vec<u32> {
    let width = *shape.last().unwrap();
    let cols = |parts: usize| -> Vec<u32> {
        let w = width / parts / t;
        values
            .chunks_exact(width)
            .flat_map(|row| {
                (0..parts).flat_map(move |p| {
                    let s = p * width / parts + r * w;
                    row[s..s + w].to_vec()
                })
            })
            .collect()
    };
    match name {
        "attn.qkv.w" | "attn.qkv.b" => cols(3),
        "mlp.fc.w" | "mlp.fc.b" => cols(1),
        "attn.proj.w" | "mlp.proj.w" => {
            let rows = shape[0] / t;
            values[r * rows * width..(r + 1) * rows * width].to_vec()
        }
        _ => values.to_vec(),
    }
}

fn check_split_runs(precision: Precision) {
    let one = run(&config(Some(1), precision)).remove(0);
    assert_eq!(one.losses.len(), 4);
    let losses: Vec<f64> = one.losses.iter().map(|b| f64::from_bits(*b)).collect();
    assert!(
        losses.iter().all(|l| l.is_finite()) && losses[3] < losses[0],
        "{losses:?}"
    );
    for t in [2, 4] {
        let ranks = run(&config(Some(t), precision));
        assert_eq!(ranks.len(), t);
        for (r, rank) in ranks.iter().enumerate() {
            let case = format!("{precision}, rank {r} of {t}");
            assert_eq!(rank.losses, one.losses, "losses, {case}");
            for ((name, specs, values), (_, full_specs, full)) in
                rank.blocks.iter().zip(&one.blocks)
            {
                for ((slot, shape, offset), (_, full_shape, full_offset)) in
                    specs.iter().zip(full_specs)
                {
                    let n: usize = shape.iter().product();
                    let m: usize = full_shape.iter().product();
                    let expected =
                        slice(slot, full_shape, &full[*full_offset..full_offset + m], r, t);
                    assert_eq!(
                        values[*offset..offset + n],
                        expected,
                        "{name}.{slot}, {case}"
                    );
                }
            }
        }
    }
}

#[test]
fn fp32_split_over_2_and_4_ranks_trains_bitwise_as_the_unsplit_run() {
    check_split_runs(Precision::Fp32);
}

#[test]
fn bf16_mixed_split_over_2_and_4_ranks_trains_bitwise_as_the_unsplit_run() {
    check_split_runs(Precision::Bf16Mixed);
}

#[test]
fn the_unsplit_layout_trains_the_same_model_as_the_plain_run() {
    // Only the order of additions differs (chunked sums, a chunked norm): fp32 losses agree
    // to 1e-4 over 4 steps (they are about ln 256 ≈ 5.5).
    let split = run(&config(Some(1), Precision::Fp32)).remove(0);
    let plain = run(&config(None, Precision::Fp32)).remove(0);
    for (a, b) in split.losses.iter().zip(&plain.losses) {
        let (a, b) = (f64::from_bits(*a), f64::from_bits(*b));
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn the_dry_run_predicts_every_split_ranks_peak_exactly() {
    for t in [2, 4] {
        for precision in [Precision::Fp32, Precision::Bf16Mixed] {
            let c = config(Some(t), precision);
            let predicted = headroom_train::predict::predict(&c, &Corpus::bundled()).unwrap();
            for (r, rank) in run(&c).iter().enumerate() {
                assert_eq!(
                    predicted.memory.peak_bytes_by_category, rank.memory.peak_bytes_by_category,
                    "{precision}, rank {r} of {t}"
                );
                assert_eq!(
                    predicted.memory.peak_allocated_bytes, rank.memory.peak_allocated_bytes,
                    "{precision}, rank {r} of {t}"
                );
            }
        }
    }
}

fn refusal(c: TrainConfig) -> String {
    let base = TrainConfig {
        model: Some("gpt-tiny".into()),
        deterministic: Some(true),
        dropout: Some(0.0),
        optimizer: Some(Optimizer::AdamW),
        steps: Some(1),
        ..Default::default()
    };
    let c = base.overridden_by(c);
    match c.resolve() {
        Err(e) => e.to_string(),
        Ok(c) => match headroom_train::predict::predict(&c, &Corpus::bundled()) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{c:?} was not refused"),
        },
    }
}

#[test]
fn what_a_split_run_cannot_do_is_refused_with_the_fix() {
    let tp = |n| TrainConfig {
        tensor_parallel: Some(n),
        ..Default::default()
    };
    let e = refusal(tp(3));
    assert!(e.contains("power of two"), "{e}");
    let e = refusal(TrainConfig {
        data_parallel: Some(2),
        ..tp(2)
    });
    assert!(
        e.contains("--data-parallel 2") && e.contains("not supported"),
        "{e}"
    );
    // gpt-tiny has 2 heads: 4 ranks cannot split them.
    let e = refusal(tp(4));
    assert!(e.contains("2 heads") && e.contains("size 4"), "{e}");
    let e = refusal(TrainConfig {
        optimizer: Some(Optimizer::Adafactor),
        ..tp(2)
    });
    assert!(e.contains("adafactor"), "{e}");
}

#[test]
fn the_planners_tensor_parallel_model_follows_a_split_rank() {
    // The planner's mesh model (Megatron-LM's: vocabulary-parallel embedding, no linear biases,
    // Korthikanti et al.'s activations) against a rank of the engine's split gpt-small (4 layers,
    // h 128, 4 heads, MLP 512, V 256, context 128), bf16-mixed, one step of 1 × 128 tokens.
    use headroom_memory::Category;
    use headroom_plan::mesh::{MeshFramework, MeshModel, Recompute, mesh_memory};
    use headroom_train::strategy::{Mesh, ZeroStage};
    let (l, h, f, s, v) = (4u64, 128u64, 512u64, 128u64, 256u64);
    let model = MeshModel {
        seq: s,
        micro_batch: 1,
        hidden: h,
        heads: 4,
        kv_heads: 4,
        layers: l,
        vocab: v,
        ffn: f,
        gated: false,
        norm_params: 2,
        tied_embeddings: true,
        moe: None,
    };
    let engine = |t: usize| {
        let c = TrainConfig {
            deterministic: Some(true),
            model: Some("gpt-small".into()),
            seq_len: Some(128),
            dropout: Some(0.0),
            precision: Some(Precision::Bf16Mixed),
            optimizer: Some(Optimizer::AdamW),
            micro_batch: Some(1),
            tensor_parallel: Some(t),
            steps: Some(1),
            eval_every: Some(0),
            eval_batches: Some(1),
            device_memory: Some("256MiB".parse().unwrap()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        run(&c).remove(0)
    };
    let planned = |t: u64| {
        let mesh = Mesh {
            tp: t,
            ..Default::default()
        };
        mesh_memory(
            &model,
            &mesh,
            MeshFramework::Megatron,
            ZeroStage::default(),
            Recompute::None,
        )
        .peak()
        .clone()
    };
    let whole = engine(1);
    // The activation category's own peak: what forward keeps for backward, at its largest.
    let activations = |r: &Rank| r.memory.peak_bytes_by_category[Category::Activation] as f64;
    for t in [2u64, 4] {
        let rank = engine(t as usize);
        let plan = planned(t);
        // Parameters: the engine holds, beyond the planner's rank, each layer's biases (q/k/v's
        // 3h/t and the MLP's f/t split, the two output projections' 2h whole), the token
        // embedding whole (V·h against the planner's V·h/t) and the learned positions (s·h):
        // at t = 2, 4·704 + 16,384 + 16,384 = 35,584 more than the planner's 411,904.
        let extra = l * (3 * h / t + f / t + 2 * h) + v * h - v * h / t + s * h;
        assert_eq!(rank.parameters, plan.parameters as u64 + extra, "t = {t}");
        // Activations: the planner's share of the unsplit rank's against the measured share.
        // Planner (16-bit, Korthikanti et al. without SP): per layer sbh(10 + 24/t + 5as/(ht)),
        // sbh = 16,384, 5as/h = 20, plus the ids (8sb), the embedding's output (sbh) and the
        // head's 4sbh + 4sbV/t: 3,752,960 B at t = 1, 2,245,632 (0.598) at 2, 1,491,968 (0.398)
        // at 4.
        // The engine keeps more than that share (measured 0.653 at 2, 0.480 at 4, +9 % and
        // +21 %): beside the split heads and MLP features it keeps whole on every rank the
        // residual stream, both norms' outputs, the summed attention and MLP outputs and the
        // head's logits (V = 256 is not split), which weigh more in a model this small than
        // Korthikanti et al.'s 10sbh. Held within 25 %.
        let planned_share = plan.activations / planned(1).activations;
        let measured_share = activations(&rank) / activations(&whole);
        assert!(
            (measured_share / planned_share - 1.0).abs() < 0.25,
            "t = {t}: measured {measured_share:.3}, planned {planned_share:.3}"
        );
    }
}

#[test]
fn without_deterministic_a_split_run_agrees_with_the_unsplit_one_to_rounding() {
    // Outside --deterministic each rank sums its slice in one product (one chunk per rank):
    // only the order of additions changes, so fp32 losses over 4 steps agree to 1e-4.
    let loose = |tp| RunConfig {
        deterministic: false,
        ..config(tp, Precision::Fp32)
    };
    let whole = run(&loose(Some(1))).remove(0);
    for rank in run(&loose(Some(2))) {
        for (a, b) in rank.losses.iter().zip(&whole.losses) {
            let (a, b) = (f64::from_bits(*a), f64::from_bits(*b));
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}
