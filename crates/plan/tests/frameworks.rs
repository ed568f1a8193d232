//! Framework-true layouts (`--framework`): DeepSpeed's ZeRO engine against PyTorch's
//! DDP/FSDP with autocast or FSDP mixed precision, each category derived by hand; FSDP's
//! offload rules; the exports follow the plan's framework.

use crate::support;

use headroom_plan::cost::{Plan, Problem, activation, evaluate};
use headroom_plan::export::{ExportOptions, accelerate::accelerate_config, deepspeed::ds_config};
use headroom_plan::search::search;
use headroom_plan::strategy::{
    Attention, Category, Checkpoint, Framework, Loss, Offload, Optimizer, OptimizerImpl, Pins,
    Placement, Precision, Strategy, ZeroStage,
};
use support::problem;

/// Llama-2-7B: 6,738,415,616 parameters (tests/param_counts.rs).
const PSI: f64 = 6_738_415_616.0;
/// One Llama-2-7B block: q, k, v, o 4·4096² + gate, up, down 3·4096·11,008 + two norms.
const BLOCK: f64 = 4.0 * 4096.0 * 4096.0 + 3.0 * 4096.0 * 11_008.0 + 2.0 * 4096.0;
/// Outside the blocks: embedding and untied head 2·32,000·4096, final norm 4096.
const ROOT: f64 = 2.0 * 32_000.0 * 4096.0 + 4096.0;
/// The largest module, the embedding (or head): 32,000·4096.
const LARGEST: f64 = 32_000.0 * 4096.0;

fn strategy(precision: Precision, zero: u8, mb: u64) -> Strategy {
    Strategy {
        precision,
        optimizer: Optimizer::AdamW,
        placement: Placement {
            zero_stage: ZeroStage::new(zero).unwrap(),
            offload_optimizer: Offload::None,
            offload_params: Offload::None,
            offload_activations: Offload::None,
        },
        checkpoint: Checkpoint::ALL_BLOCKS,
        attention: Attention::MemoryEfficient,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch: mb,
        accumulation: 1,
    }
}

fn at(p: &Plan, c: Category) -> f64 {
    p.memory.breakdown.at_peak[c] as f64
}

#[test]
fn zero_3_bf16_mixed_per_framework_by_hand() {
    // Micro-batch 4 of 4096 tokens: the peak is in backward, where the gathered units live.
    // Two micro-batches a step, so under both frameworks every gradient shard is there from
    // the first micro-batch's backward on (with one, PyTorch's zero_grad leaves none before
    // the blocks make theirs).
    let ds = problem("llama-2-7b", "A100-80GB", 8, 1, 4096, 64);
    let fsdp = ds.clone().with_framework(Framework::Fsdp);
    let s = Strategy {
        accumulation: 2,
        ..strategy(Precision::Bf16Mixed, 3, 4)
    };
    let (d, f) = (evaluate(&ds, &s), evaluate(&fsdp, &s));
    use headroom_plan::cost::memory::Phase;
    assert_eq!(d.memory.peak_phase, Phase::ForwardBackward);
    assert_eq!(f.memory.peak_phase, Phase::ForwardBackward);
    assert_eq!(BLOCK, 202_383_360.0);
    // FSDP: fp32 parameter shards (the master copy) and the bf16 root unit plus two blocks
    // gathered; fp32 gradient shards and one unit's bf16 gradient (the root, the larger); no
    // separate master weights; fp32 AdamW states.
    assert_eq!(
        at(&f, Category::Parameter),
        4.0 * PSI / 8.0 + 2.0 * (ROOT + 2.0 * BLOCK)
    );
    assert_eq!(at(&f, Category::Gradient), 4.0 * PSI / 8.0 + 2.0 * ROOT);
    assert_eq!(at(&f, Category::MasterWeight), 0.0);
    assert_eq!(at(&f, Category::OptimizerState), 8.0 * PSI / 8.0);
    // DeepSpeed: bf16 shards; the largest module gathered whole plus Hugging Face's "auto"
    // prefetch of 0.9·h² elements and the persistent tensors of ≤ 10·h elements (65 norms of
    // 4096); the largest module's gradient; fp32 master shards; and, over the two
    // micro-batches, fp32 sums of the gradient shard (DeepSpeed's `grad_accum_dtype`).
    let prefetch = (0.9 * 4096.0 * 4096.0_f64).floor();
    let persistent = 65.0 * 4096.0;
    assert_eq!(
        at(&d, Category::Parameter),
        2.0 * PSI / 8.0 + 2.0 * (LARGEST + prefetch + persistent)
    );
    assert_eq!(
        at(&d, Category::Gradient),
        2.0 * PSI / 8.0 + 4.0 * PSI / 8.0 + 2.0 * LARGEST
    );
    assert_eq!(at(&d, Category::MasterWeight), 4.0 * PSI / 8.0);
    assert_eq!(at(&d, Category::OptimizerState), 8.0 * PSI / 8.0);
    // Both keep 16 bytes per parameter of sharded model states, DeepSpeed 4 more for its sums.
    let sharded = |p: &Plan, gathered: f64, grad_unit: f64| {
        at(p, Category::Parameter)
            + at(p, Category::Gradient)
            + at(p, Category::MasterWeight)
            + at(p, Category::OptimizerState)
            - gathered
            - grad_unit
    };
    let fsdp_states = sharded(&f, 2.0 * (ROOT + 2.0 * BLOCK), 2.0 * ROOT);
    let ds_states = sharded(&d, 2.0 * (LARGEST + prefetch + persistent), 2.0 * LARGEST);
    assert_eq!(fsdp_states, ds_states - 4.0 * PSI / 8.0);
    assert_eq!(fsdp_states, 16.0 * PSI / 8.0);
}

#[test]
fn ddp_autocast_keeps_fp32_weights_grads_casts_and_fp32_islands() {
    // bert-large-uncased, fp16 autocast under DDP (stage 0) on one V100, micro-batch 4 × 512
    // accumulated twice (so every gradient is there through backward under both), naive
    // attention, no checkpointing.
    let ds = problem("bert-large-uncased", "V100-16GB", 1, 1, 512, 8);
    let torch = ds.clone().with_framework(Framework::Fsdp);
    let s = Strategy {
        checkpoint: Checkpoint::None,
        attention: Attention::Naive,
        accumulation: 2,
        ..strategy(Precision::Fp16Mixed, 0, 4)
    };
    let (d, t) = (evaluate(&ds, &s), evaluate(&torch, &s));
    let psi = torch.facts.params as f64;
    let matmul = torch.facts.active_matmul_params;
    // fp32 parameters plus autocast's fp16 copy of every matmul weight; fp32 gradients; no
    // master copy (the parameters are it).
    assert_eq!(
        at(&t, Category::Parameter),
        4.0 * psi + 2.0 * matmul.round()
    );
    assert_eq!(at(&t, Category::Gradient), 4.0 * psi);
    assert_eq!(at(&t, Category::MasterWeight), 0.0);
    // DeepSpeed's fp16 engine: 16-bit parameters and gradients and, over the two
    // micro-batches, their fp32 sums (`grad_accum_dtype`); fp32 master.
    assert_eq!(at(&d, Category::Parameter), 2.0 * psi);
    assert_eq!(at(&d, Category::Gradient), 2.0 * psi + 4.0 * psi);
    assert_eq!(at(&d, Category::MasterWeight), 4.0 * psi);
    // Activations, autocast against a 16-bit model, per block: two fp32 norm inputs (+2 bytes
    // each), separate q, k, v each saving a cast of the fp32 norm output (+2 casts of 2 bytes),
    // the softmax output in fp32 (+2 bytes per score); outside the blocks the final norm's
    // fp32 input (+2·sbh). The logits are fp32 under both (Hugging Face upcasts them).
    let (sb, h, a, ss) = (4.0 * 512.0, 1024.0, 16.0, 512.0 * 512.0 * 4.0);
    let per_block = 2.0 * 2.0 * sb * h + 2.0 * 2.0 * sb * h + 2.0 * a * ss;
    let want = 24.0 * per_block + 2.0 * sb * h;
    // Compared where backward starts (the loss's node), before either peak's own choice
    // between it and the blocks' backward.
    let held = |p: &Problem| {
        activation::held_at_backward_start(
            &p.spec,
            512.0,
            4.0,
            activation::Width::of(p.framework, &s),
            s.attention,
            s.checkpoint,
            s.loss,
        )
    };
    let got = held(&torch) - held(&ds);
    assert!((got - want).abs() <= 2.0, "{got} vs {want}");
}

#[test]
fn fsdp_offloads_everything_to_the_cpu_or_nothing() {
    let p = problem("llama-2-70b", "A100-80GB", 8, 1, 4096, 8).with_framework(Framework::Fsdp);
    let out = search(&p, &Pins::default(), None).unwrap();
    for plan in out.fitting.iter().chain(out.rejected.iter()) {
        let pl = plan.strategy.placement;
        let offloaded = pl.offload_optimizer.is_offloaded() || pl.offload_params.is_offloaded();
        assert!(
            !offloaded
                || (pl.offload_optimizer == Offload::Cpu
                    && pl.offload_params == Offload::Cpu
                    && pl.zero_stage.shards_parameters()),
            "{:?}",
            plan.strategy
        );
    }
    for pins in [
        Pins {
            offload_optimizer: Some(Offload::Nvme),
            ..Pins::default()
        },
        Pins {
            offload_optimizer: Some(Offload::Cpu),
            offload_params: Some(Offload::None),
            ..Pins::default()
        },
    ] {
        let e = search(&p, &pins, None).unwrap_err().to_string();
        assert!(
            e.contains("--framework deepspeed") && e.contains("CPUOffload"),
            "{e}"
        );
    }
}

#[test]
fn exports_follow_the_plans_framework() {
    let ds = problem("llama-2-7b", "A100-80GB", 8, 1, 4096, 8);
    let fsdp = ds.clone().with_framework(Framework::Fsdp);
    let s = strategy(Precision::Bf16Mixed, 3, 1);
    let opts = ExportOptions::default();
    // A DeepSpeed plan: the ds_config writes the live-parameter cap it charged; Accelerate
    // takes its DeepSpeed plugin.
    let cfg = ds_config(&ds, &evaluate(&ds, &s), &opts).unwrap();
    assert_eq!(
        cfg["zero_optimization"]["stage3_max_live_parameters"],
        1_000_000_000u64
    );
    let acc = accelerate_config(&ds, &evaluate(&ds, &s), &opts).unwrap();
    assert!(acc.contains("distributed_type: DEEPSPEED"), "{acc}");
    // An FSDP plan: no ds_config (its memory is FSDP's), Accelerate's FSDP section.
    let e = ds_config(&fsdp, &evaluate(&fsdp, &s), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--framework deepspeed"), "{e}");
    let acc = accelerate_config(&fsdp, &evaluate(&fsdp, &s), &opts).unwrap();
    assert!(acc.contains("distributed_type: FSDP"), "{acc}");
}

#[test]
fn a_fused_or_per_tensor_step_holds_less_than_foreach() {
    // Llama-2-7B on one H100, bf16-mixed AdamW: foreach holds an fp32 copy of the model at
    // the step, a per-tensor loop the largest tensor's, a fused kernel nothing.
    let p = problem("llama-2-7b", "H100-80GB", 1, 1, 2048, 1);
    let s = strategy(Precision::Bf16Mixed, 0, 1);
    let temp = |i: OptimizerImpl| {
        let q: Problem = p.clone().with_optimizer_impl(i);
        let plan = evaluate(&q, &s);
        (plan.memory.peak_phase, at(&plan, Category::Temporary))
    };
    use headroom_plan::cost::memory::Phase;
    assert_eq!(
        temp(OptimizerImpl::Foreach),
        (Phase::OptimizerStep, 4.0 * PSI)
    );
    let (phase, t) = temp(OptimizerImpl::PerTensor);
    // Without the copy the peak moves into backward (its temporary: the logits' gradient).
    assert_eq!(phase, Phase::ForwardBackward, "{t}");
    let step = |i: OptimizerImpl| {
        let q = p.clone().with_optimizer_impl(i);
        let plan = evaluate(&q, &s);
        plan.memory.breakdown.at_peak.total()
    };
    assert!(step(OptimizerImpl::Fused) <= step(OptimizerImpl::PerTensor));
    assert!(step(OptimizerImpl::PerTensor) < step(OptimizerImpl::Foreach));
}
