//! The advice says what the levers do at the peak the plan actually has, and speaks of one GPU
//! as one GPU.

mod support;

use headroom_plan::advice::explain;
use headroom_plan::cost::memory::Phase;
use headroom_plan::cost::{Problem, evaluate};
use headroom_plan::strategy::{
    Attention, Checkpoint, Loss, Optimizer, Placement, Precision, Strategy, ZeroStage,
};
use support::problem;

fn one_gpu(model: &str, gpu: &str, seq: u64, batch: u64) -> Problem {
    problem(model, gpu, 1, 1, seq, batch)
}

fn strategy(zero: u8, attention: Attention, micro_batch: u64, accumulation: u64) -> Strategy {
    Strategy {
        precision: Precision::Bf16Mixed,
        optimizer: Optimizer::AdamW,
        placement: Placement {
            zero_stage: ZeroStage::new(zero).unwrap(),
            ..Placement::default()
        },
        checkpoint: Checkpoint::None,
        attention,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch,
        accumulation,
    }
}

#[test]
fn no_activation_savings_are_claimed_at_an_optimizer_step_peak() {
    // gpt2-medium (354,823,168 parameters) at micro-batch 1, seq 1024: the optimizer step holds
    // one fp32 copy of the parameters (4 × 354.8 M = 1.42 GB) as foreach AdamW's temporary,
    // more than the backward's activations (24 blocks × 34·s·h bytes = 0.86 GB plus the fp32
    // logits 4·s·v = 0.21 GB), so the peak is in the step and no activation is live there.
    let p = one_gpu("gpt2-medium", "RTX-4090", 1024, 32);
    let plan = evaluate(&p, &strategy(0, Attention::MemoryEfficient, 1, 32));
    assert_eq!(plan.memory.peak_phase, Phase::OptimizerStep);
    let advice = explain(&p, &plan).join("\n");
    assert!(!advice.contains("them to 0 B"), "{advice}");
    assert!(advice.contains("do not lower the peak"), "{advice}");
}

#[test]
fn zero_3_on_one_gpu_says_it_shards_nothing() {
    let p = one_gpu("gpt2", "RTX-4090", 1024, 8);
    let plan = evaluate(&p, &strategy(3, Attention::MemoryEfficient, 1, 8));
    let advice = explain(&p, &plan).join("\n");
    assert!(
        advice.contains("ZeRO-3 on one GPU shards nothing"),
        "{advice}"
    );
    assert!(!advice.contains("1 GPUs"), "{advice}");
}
