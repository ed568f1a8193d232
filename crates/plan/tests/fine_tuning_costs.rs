//! What the analytical model charges for the fine-tuning levers. A chunked loss (`--loss
//! chunked:K`): a K-th of the fp32 logits and of their gradient at once, and the output
//! projection's forward once more in backward — and the search takes it when it is what makes a
//! run fit (Llama-3-8B, vocabulary 128,256, on 8 × H100-80GB at 8,192 tokens, ZeRO-3, every block
//! checkpointed). The optimizer step in backward: the gradient and the step's temporaries of the
//! largest tensor instead of the model's, on one GPU only (Llama-2-7B on an H100-80GB).

use crate::support;

use headroom_plan::cost::memory::Phase;
use headroom_plan::cost::{Plan, Problem, activation, evaluate};
use headroom_plan::search::search;
use headroom_plan::strategy::{
    Attention, Category, Checkpoint, Loss, Optimizer, Pins, Placement, Precision, Strategy,
    ZeroStage,
};
use headroom_plan::workload::{BatchSpec, Workload};
use support::problem;

const S: f64 = 8192.0;
const V: f64 = 128_256.0;
const H: f64 = 4096.0;

/// 8 sequences a GPU per step at `micro_batch` × the rest accumulated.
fn llama(micro_batch: u64) -> Problem {
    let p = problem("llama-3-8b", "H100-80GB", 8, 1, 8192, 64);
    let workload = Workload::new(
        &p.spec,
        8192,
        BatchSpec::Samples(64),
        Some(micro_batch),
        None,
        8,
    )
    .unwrap();
    Problem { workload, ..p }
}

fn strategy(loss: Loss, micro_batch: u64) -> Strategy {
    let accumulation = 8 / micro_batch;
    Strategy {
        precision: Precision::Bf16Mixed,
        optimizer: Optimizer::AdamW,
        placement: Placement {
            zero_stage: ZeroStage::new(3).unwrap(),
            ..Placement::default()
        },
        checkpoint: Checkpoint::ALL_BLOCKS,
        attention: Attention::MemoryEfficient,
        loss,
        optimizer_in_backward: false,
        micro_batch,
        accumulation,
    }
}

fn at_peak(p: &Plan, c: Category) -> f64 {
    p.memory.breakdown.at_peak[c] as f64
}

#[test]
fn a_chunked_loss_holds_a_kth_of_the_logits_and_recomputes_the_projection() {
    let p = llama(1);
    let plain = evaluate(&p, &strategy(Loss::Plain, 1));
    let chunked = evaluate(&p, &strategy(Loss::Chunked(8), 1));
    // Hugging Face's plain loss holds the fp32 log-probabilities, 4·s·b·v bytes (the model's
    // bf16 logits are released with its output before backward), and allocates two fp32
    // gradients in backward, 8·s·b·v; a chunked loss holds one chunk's fp32 log-probabilities,
    // 4·s·b·v/8, and allocates that chunk's two gradients, 8·s·b·v/8.
    let spec = &p.spec;
    let held = |l| activation::logits(spec, S, 1.0, 2.0, l);
    let grads = |l| activation::logits_grad(spec, S, 1.0, 2.0, l);
    assert_eq!(held(Loss::Plain), 4.0 * S * V);
    assert_eq!(held(Loss::Chunked(8)), 4.0 * S * V / 8.0);
    assert_eq!(grads(Loss::Plain), 8.0 * S * V);
    assert_eq!(grads(Loss::Chunked(8)), 8.0 * S * V / 8.0);
    // The plain loss sets the peak at its own node, its two gradients the workspace there;
    // chunked, the peak is lower.
    assert_eq!(at_peak(&plain, Category::Temporary), 8.0 * S * V);
    assert!(chunked.memory.per_device_peak_bytes < plain.memory.per_device_peak_bytes);
    // One more forward of the projection per token: 2·h·v FLOPs for each of 8 GPUs × 8
    // sequences × 8,192 tokens a step.
    let extra = chunked.time.recompute_flops - plain.time.recompute_flops;
    let want = 2.0 * H * V * 64.0 * S;
    assert!((extra - want).abs() <= want * 1e-12, "{extra} vs {want}");
    assert!(chunked.time.step_s > plain.time.step_s);
    assert_eq!(chunked.time.model_flops, plain.time.model_flops);
}

#[test]
fn the_search_chunks_the_loss_only_when_the_plain_one_does_not_fit() {
    // Every block checkpointed: at micro-batch 1 × accumulation 8 without checkpointing only a
    // chunked loss leaves room for the f32 gradient sums, and is then the faster plan.
    let pins = |micro_batch| Pins {
        micro_batch: Some(micro_batch),
        checkpoint: Some(Checkpoint::ALL_BLOCKS),
        ..Pins::default()
    };
    // Micro-batch 1: the plain loss fits and is faster.
    let out = search(&llama(1), &pins(1), None).unwrap();
    assert_eq!(out.recommended().unwrap().strategy.loss, Loss::Plain);
    // Micro-batch 8: the loss's tensors alone are 12 · 8,192 · 8 · 128,256 bytes (94 GiB) at
    // its backward peak, and no plain plan fits 80 GB.
    let out = search(&llama(8), &pins(8), None).unwrap();
    assert!(out.fitting.iter().all(|p| p.strategy.loss != Loss::Plain));
    let best = out.recommended().unwrap();
    assert_eq!(best.strategy.loss, Loss::Chunked(8));
}

/// Llama-2-7B on one H100-80GB, 2,048 tokens, bf16-mixed AdamW, every block checkpointed.
fn llama2_alone(in_backward: bool) -> (Problem, Plan) {
    let p = problem("llama-2-7b", "H100-80GB", 1, 1, 2048, 1);
    let s = Strategy {
        placement: Placement::default(),
        optimizer_in_backward: in_backward,
        ..strategy(Loss::Plain, 8)
    };
    let s = Strategy {
        micro_batch: 1,
        accumulation: 1,
        ..s
    };
    let plan = evaluate(&p, &s);
    (p, plan)
}

#[test]
fn the_step_in_backward_holds_the_largest_tensors_gradient_instead_of_the_models() {
    let (psi, largest) = (6_738_415_616.0, 131_072_000.0); // embed_tokens: 32,000 × 4,096
    let (_, ordinary) = llama2_alone(false);
    let (_, fused) = llama2_alone(true);
    let at = |p: &Plan, c: Category| p.memory.breakdown.at_peak[c] as f64;
    // Ordinary: the peak is the optimizer step, with every bf16 gradient (2 bytes each) and
    // foreach AdamW's fp32 copy of the model.
    assert_eq!(ordinary.memory.peak_phase, Phase::OptimizerStep);
    assert_eq!(at(&ordinary, Category::Gradient), 2.0 * psi);
    assert_eq!(at(&ordinary, Category::Temporary), 4.0 * psi);
    // In backward: the largest tensor's gradient; the step's temporaries shrink to 4 bytes of
    // it, so the peak moves into backward, whose temporaries are the loss's two fp32
    // gradients (of the log-probabilities and of the logits).
    assert_eq!(fused.memory.peak_phase, Phase::ForwardBackward);
    assert_eq!(at(&fused, Category::Gradient), 2.0 * largest);
    assert_eq!(at(&fused, Category::Temporary), 8.0 * 2048.0 * 32_000.0);
    assert!(fused.memory.per_device_peak_bytes < ordinary.memory.per_device_peak_bytes);
    assert_eq!(fused.time.step_s, ordinary.time.step_s);
}

#[test]
fn the_search_tries_the_step_in_backward_on_one_gpu_only() {
    let one = problem("llama-2-7b", "RTX-4090", 1, 1, 1024, 1);
    let out = search(&one, &Pins::default(), None).unwrap();
    assert!(out.fitting.iter().any(|p| p.strategy.optimizer_in_backward));
    assert!(
        out.fitting
            .iter()
            .filter(|p| p.strategy.optimizer_in_backward)
            .all(|p| p.strategy.accumulation == 1 && !p.strategy.placement.moves_model_states())
    );
    let eight = problem("llama-2-7b", "H100-80GB", 8, 1, 2048, 8);
    let out = search(&eight, &Pins::default(), None).unwrap();
    assert!(
        out.fitting
            .iter()
            .all(|p| !p.strategy.optimizer_in_backward)
    );
    let pinned = Pins {
        optimizer_in_backward: Some(true),
        ..Pins::default()
    };
    let e = search(&eight, &pinned, None).err().unwrap().to_string();
    assert!(
        e.contains("--optimizer-in-backward") && e.contains("one GPU"),
        "{e}"
    );
}

#[test]
fn paged_8_bit_states_keep_one_block_on_the_device_and_the_rest_on_the_host() {
    // Llama-2-7B on one RTX-4090, bf16-mixed: 8-bit states are 2 bytes per parameter plus
    // 2 × 4 bytes per 256; paged, the device holds one gather unit's share (the larger of a
    // block and the largest module: a block, 4·4096² + 3·4096·11,008 + 2·4096 = 202,383,360
    // parameters), the host the whole.
    let p = support::problem("llama-2-7b", "RTX-4090", 1, 1, 512, 1);
    let at = |optimizer: Optimizer| {
        let s = Strategy {
            optimizer,
            ..support::plain_strategy(Precision::Bf16Mixed, 1, 1)
        };
        evaluate(&p, &s)
    };
    let (plain, paged) = (at(Optimizer::AdamW8bit), at(Optimizer::PagedAdamW8bit));
    let params = 6_738_415_616f64;
    let full = 2.0 * params + 8.0 * (params / 256.0).ceil();
    let state = |plan: &Plan| plan.memory.breakdown.steady[Category::OptimizerState] as f64;
    assert!((state(&plain) - full).abs() <= 1.0, "{}", state(&plain));
    let unit = 202_383_360f64;
    assert!(
        (state(&paged) - full * unit / params).abs() <= 1.0,
        "{}",
        state(&paged)
    );
    // The host takes the whole state.
    let host = paged.memory.host_bytes_per_node as f64 - plain.memory.host_bytes_per_node as f64;
    assert!((host - full).abs() <= 1.0, "{host}");
    // Paging crosses PCIe twice a step: slower, never faster.
    assert!(paged.time.step_s > plain.time.step_s);
}
