//! The levers ranked for one run: each lever applied alone to the stated strategy, in the order
//! of Hugging Face's single-GPU guide, and the first that fits, on cases derived by hand.

use crate::support;

use headroom_plan::cost::{CostModel, Problem, evaluate};
use headroom_plan::levers::{Lever, apply, rank};
use headroom_plan::strategy::{
    Attention, Checkpoint, Loss, Offload, Optimizer, Placement, Precision, Strategy, ZeroStage,
};
use support::problem;

fn stated(
    precision: Precision,
    optimizer: Optimizer,
    micro_batch: u64,
    checkpoint: Checkpoint,
) -> Strategy {
    Strategy {
        precision,
        optimizer,
        placement: Placement::default(),
        checkpoint,
        attention: Attention::Naive,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch,
        accumulation: 1,
    }
}

/// gpt2 on one A100-80GB with no margin and no fragmentation reserve, so that "fits" means
/// peak ≤ capacity.
fn exact(capacity: u64) -> Problem {
    let mut p = problem("gpt2", "A100-80GB", 1, 1, 128, 8);
    p.cost = CostModel {
        margin: 0.0,
        fragmentation: 0.0,
        ..CostModel::default()
    };
    p.hardware.gpu.memory_bytes = capacity;
    p
}

/// The stated strategy with one lever changed by hand, independently of `apply`.
fn with(s: Strategy, f: impl FnOnce(&mut Strategy)) -> Strategy {
    let mut s = s;
    f(&mut s);
    s
}

fn peak(p: &Problem, s: &Strategy) -> u64 {
    evaluate(p, s).memory.per_device_peak_bytes
}

#[test]
fn the_levers_come_in_the_guides_order_and_those_that_cannot_apply_say_why() {
    // Hugging Face's single-GPU guide: batch size with gradient accumulation, gradient
    // checkpointing, mixed precision, optimizer choice (8-bit Adam), then DeepSpeed ZeRO and
    // its offload.
    assert_eq!(
        Lever::ORDER,
        [
            Lever::MicroBatch,
            Lever::Checkpointing,
            Lever::Precision,
            Lever::EightBitStates,
            Lever::Sharding,
            Lever::Offload
        ]
    );
    let p = exact(80 << 30);
    let s = stated(Precision::Bf16, Optimizer::AdamW, 1, Checkpoint::ALL_BLOCKS);
    let r = rank(&p, &s);
    let order: Vec<Lever> = r.levers.iter().map(|l| l.lever).collect();
    assert_eq!(order, Lever::ORDER);
    // Micro-batch 1, every block checkpointed, pure bf16: none of the first three applies.
    for l in &r.levers[..3] {
        assert_eq!(l.strategy, None, "{:?}", l.lever);
        assert!(!l.fits);
    }
    assert!(r.levers[0].change.contains("already 1"));
    assert!(r.levers[1].change.contains("already checkpointed"));
    assert!(r.levers[2].change.contains("already pure bf16"));
    // 8-bit states already 8-bit: does not apply either.
    let eight = with(s, |s| s.optimizer = Optimizer::AdamW8bit);
    assert!(apply(&p, &eight, Lever::EightBitStates).is_err());
}

#[test]
fn the_micro_batch_lever_keeps_the_global_batch() {
    let p = exact(80 << 30);
    let mut s = stated(Precision::Bf16Mixed, Optimizer::AdamW, 6, Checkpoint::None);
    s.accumulation = 2;
    let (m, _) = apply(&p, &s, Lever::MicroBatch).unwrap();
    assert_eq!((m.micro_batch, m.accumulation), (3, 4));
    s.micro_batch = 3;
    let (m, change) = apply(&p, &s, Lever::MicroBatch).unwrap();
    assert_eq!((m.micro_batch, m.accumulation), (1, 6));
    assert_eq!(change, "--micro-batch 1 --accumulation 6");
    // fp32 goes to bf16-mixed on a GPU with bf16, and on to pure bf16 from there.
    let fp32 = stated(Precision::Fp32, Optimizer::AdamW, 1, Checkpoint::None);
    assert_eq!(
        apply(&p, &fp32, Lever::Precision).unwrap().0.precision,
        Precision::Bf16Mixed
    );
    let mixed = stated(Precision::Bf16Mixed, Optimizer::AdamW, 1, Checkpoint::None);
    assert_eq!(
        apply(&p, &mixed, Lever::Precision).unwrap().0.precision,
        Precision::Bf16
    );
    // Optimizer offload needs ZeRO ≥ 1; the lever takes stage 2 as DeepSpeed's ZeRO-Offload.
    let (o, _) = apply(&p, &mixed, Lever::Offload).unwrap();
    assert_eq!(o.placement.offload_optimizer, Offload::Cpu);
    assert_eq!(o.placement.zero_stage, ZeroStage::new(2).unwrap());
}

#[test]
fn on_one_gpu_sharding_saves_nothing() {
    // ZeRO divides the model states by the number of data-parallel ranks (Rajbhandari et al.
    // 2020, §5): one rank keeps all of them.
    let p = exact(80 << 30);
    let s = stated(Precision::Bf16Mixed, Optimizer::AdamW, 2, Checkpoint::None);
    let r = rank(&p, &s);
    assert_eq!(r.levers[4].lever, Lever::Sharding);
    assert_eq!(r.levers[4].saving_bytes, Some(0));
}

#[test]
fn the_first_lever_that_fits_is_the_cheapest_not_the_largest_saving() {
    let s = stated(Precision::Bf16, Optimizer::AdamW, 1, Checkpoint::ALL_BLOCKS);
    let probe = exact(80 << 30);
    // Each lever's strategy built by hand and costed on its own.
    let base = peak(&probe, &s);
    let eight = peak(&probe, &with(s, |s| s.optimizer = Optimizer::AdamW8bit));
    let offload = peak(
        &probe,
        &with(s, |s| {
            s.placement.offload_optimizer = Offload::Cpu;
            s.placement.zero_stage = ZeroStage::new(2).unwrap();
        }),
    );
    // The case: offload saves more than 8-bit states, and both save something.
    assert!(offload < eight && eight < base, "{offload} {eight} {base}");

    // Capacity at the 8-bit plan's peak: 8-bit states and offload both fit; 8-bit comes first in
    // the guide's order (index 3), though offload saves more.
    let r = rank(&exact(eight), &s);
    assert!(!r.stated_fits);
    assert!(r.levers[3].fits && r.levers[5].fits && !r.levers[4].fits);
    assert_eq!(r.first_fit, Some(3));
    assert_eq!(r.levers[3].saving_bytes, Some(base as i64 - eight as i64));
    assert_eq!(r.levers[5].saving_bytes, Some(base as i64 - offload as i64));

    // A byte less: only offload fits (sharding on one GPU saves nothing).
    let r = rank(&exact(eight - 1), &s);
    assert_eq!(r.first_fit, Some(5));

    // Below the offload plan's peak nothing fits alone.
    let r = rank(&exact(offload - 1), &s);
    assert_eq!(r.first_fit, None);
    assert!(r.levers.iter().all(|l| !l.fits));

    // At the stated peak the run fits as it is, and every applicable lever that saves fits.
    let r = rank(&exact(base), &s);
    assert!(r.stated_fits);
    assert_eq!(r.first_fit, Some(3));
}
