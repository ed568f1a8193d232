//! Backward's two candidate peaks, derived by hand: the loss's node, first in backward, holds
//! every activation kept from forward and the loss's gradients but no parameter gradient yet
//! (PyTorch's `zero_grad()` sets them to `None`) and no re-run checkpointed block; the blocks'
//! backward holds the gradients and one re-run block once the loss's tensors are gone.

use crate::support;

use headroom_plan::cost::{Plan, evaluate};
use headroom_plan::strategy::{
    Attention, Category, Checkpoint, Framework, Loss, Optimizer, Placement, Precision, Strategy,
};
use support::problem;

// GPT-2 (124,439,808 parameters, vocabulary 50,257, width 768, 12 blocks, dropout 0.1) at 8
// sequences of 1,024 tokens on one A100-80GB, fp32.
const PSI: f64 = 124_439_808.0;
const T: f64 = 8.0 * 1024.0;
const V: f64 = 50_257.0;
const H: f64 = 768.0;

fn plan(checkpoint: Checkpoint, accumulation: u64) -> Plan {
    let p =
        problem("gpt2", "A100-80GB", 1, 1, 1024, 8 * accumulation).with_framework(Framework::Fsdp);
    let s = Strategy {
        precision: Precision::Fp32,
        optimizer: Optimizer::AdamW,
        placement: Placement::default(),
        checkpoint,
        attention: Attention::MemoryEfficient,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch: 8,
        accumulation,
    };
    evaluate(&p, &s)
}

fn at(p: &Plan, c: Category) -> f64 {
    p.memory.breakdown.at_peak[c] as f64
}

#[test]
fn no_parameter_gradient_exists_at_the_loss_node_of_a_single_micro_batch() {
    // The loss's two fp32 gradients, 8·T·V = 3.29 GB, set the peak at its node, where no
    // `.grad` exists yet under one micro-batch a step: Gradient 0 (counted before: 4·Ψ,
    // 0.5 GB). With accumulation the earlier micro-batches' fp32 gradients are held: 4·Ψ.
    let one = plan(Checkpoint::None, 1);
    assert_eq!(at(&one, Category::Temporary), 8.0 * T * V);
    assert_eq!(at(&one, Category::Gradient), 0.0);
    let two = plan(Checkpoint::None, 2);
    assert_eq!(at(&two, Category::Temporary), 8.0 * T * V);
    assert_eq!(at(&two, Category::Gradient), 4.0 * PSI);
}

#[test]
fn no_checkpointed_block_is_re_run_at_the_loss_node() {
    // Every block checkpointed, at the loss's node: the 12 block inputs 4·T·h, the embedding
    // dropout's 1-byte mask T·h, the final norm's and the head's inputs 2·4·T·h, the saved
    // fp32 log-probabilities 4·T·V. The block that backward re-runs (counted before) does not
    // exist yet.
    let p = plan(Checkpoint::ALL_BLOCKS, 1);
    assert_eq!(at(&p, Category::Temporary), 8.0 * T * V);
    let want = 12.0 * 4.0 * T * H + T * H + 2.0 * 4.0 * T * H + 4.0 * T * V;
    assert!(
        (at(&p, Category::Activation) - want).abs() <= 1.0,
        "{} vs {want}",
        at(&p, Category::Activation)
    );
}
