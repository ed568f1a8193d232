//! What the analytical model charges for a checkpoint policy. Selective recomputation
//! (Korthikanti et al. 2022, §5) drops and re-runs the core attention's s² terms; memory-efficient
//! (fused) attention never stores them and already recomputes its scores in its own backward,
//! so with it selective recomputation must cost and save exactly what no checkpointing does —
//! the case: llama-3-8b on 8 × H100-80GB, 8192 tokens, ZeRO-3, micro-batch 1.

use crate::support;

use headroom_plan::cost::{Problem, evaluate};
use headroom_plan::strategy::{
    Attention, Checkpoint, Loss, Optimizer, Placement, Precision, Strategy, ZeroStage,
};
use support::problem;

fn llama_on_8_h100() -> Problem {
    problem("llama-3-8b", "H100-80GB", 8, 1, 8192, 8)
}

fn strategy(checkpoint: Checkpoint, attention: Attention) -> Strategy {
    Strategy {
        precision: Precision::Bf16Mixed,
        optimizer: Optimizer::AdamW,
        placement: Placement {
            zero_stage: ZeroStage::new(3).unwrap(),
            ..Placement::default()
        },
        checkpoint,
        attention,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch: 1,
        accumulation: 1,
    }
}

#[test]
fn selective_recomputation_with_memory_efficient_attention_is_no_checkpointing() {
    let p = llama_on_8_h100();
    let me = Attention::MemoryEfficient;
    let none = evaluate(&p, &strategy(Checkpoint::None, me));
    let selective = evaluate(&p, &strategy(Checkpoint::Selective, me));
    assert_eq!(selective.time.recompute_flops, 0.0);
    assert_eq!(selective.time.step_s, none.time.step_s);
    assert_eq!(
        selective.memory.per_device_peak_bytes,
        none.memory.per_device_peak_bytes
    );
    // With naive attention it does what Korthikanti et al. describe: fewer activation bytes
    // than none (the s² scores are dropped), paid for by re-running the core attention.
    let naive = Attention::Naive;
    let none = evaluate(&p, &strategy(Checkpoint::None, naive));
    let selective = evaluate(&p, &strategy(Checkpoint::Selective, naive));
    assert!(selective.time.recompute_flops > 0.0);
    assert!(
        selective.memory.breakdown.at_peak[headroom_plan::strategy::Category::Activation]
            < none.memory.breakdown.at_peak[headroom_plan::strategy::Category::Activation]
    );
}
