//! Backward's two candidate peaks, derived by hand: the loss's node, first in backward, holds
//! every activation kept from forward and the loss's gradients but no parameter gradient yet
//! (PyTorch's `zero_grad()` sets them to `None`) and no re-run checkpointed block; the blocks'
//! backward holds the gradients and one re-run block once the loss's tensors are gone.

use crate::support;

use headroom_plan::cost::{Plan, evaluate};
use headroom_plan::strategy::{
    Attention, Category, Checkpoint, Framework, Loss, Optimizer, Placement, Precision, Strategy,
    ZeroGrad,
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

/// GPT-2's parameters outside the blocks: token and position embeddings (the head is tied) and
/// the final norm, 50,257·768 + 1,024·768 + 2·768; and in one block, 12·h² + 13·h (q, k, v and
/// the projection with biases, the two norms, the 4h FFN with biases). 12 blocks and the root
/// make Ψ.
const ROOT: f64 = 50_257.0 * 768.0 + 1024.0 * 768.0 + 2.0 * 768.0;
const BLOCK: f64 = 12.0 * H * H + 13.0 * H;

/// GPT-2 fp32 at 8 sequences a micro-batch with a loss in 64 chunks, so that the blocks'
/// backward, not the loss's node, sets the peak.
fn chunked(accumulation: u64) -> Strategy {
    Strategy {
        precision: Precision::Fp32,
        optimizer: Optimizer::AdamW,
        placement: Placement::default(),
        checkpoint: Checkpoint::None,
        attention: Attention::MemoryEfficient,
        loss: Loss::Chunked(64),
        optimizer_in_backward: false,
        micro_batch: 8,
        accumulation,
    }
}

#[test]
fn the_blocks_make_their_gradients_as_they_release_their_activations() {
    assert_eq!(ROOT + 12.0 * BLOCK, PSI);
    // A loss in 64 chunks holds one chunk's vocabulary-sized tensors at its node, so the
    // blocks' backward sets the peak. Backward frees a block's saved tensors once it has run it
    // and gives its parameters their gradients there: the fullest moment is the first block
    // back, every block's activations beside the root's gradients (the tied embedding, made at
    // the head, and the final norm) and that one block's, 4·(ROOT + BLOCK) bytes in fp32. Both
    // held whole (12 blocks' activations beside 12 blocks' gradients) never happens.
    let p = problem("gpt2", "A100-80GB", 1, 1, 1024, 8).with_framework(Framework::Fsdp);
    let one = evaluate(&p, &chunked(1));
    assert_eq!(at(&one, Category::Gradient), 4.0 * (ROOT + BLOCK));
    // With two micro-batches the first one's gradients are all there throughout: 4·Ψ.
    let two = evaluate(&p, &chunked(2));
    assert_eq!(at(&two, Category::Gradient), 4.0 * PSI);
}

#[test]
fn a_zero_grad_that_zero_fills_holds_every_gradient_through_the_step() {
    // Before PyTorch 2.0 `zero_grad()` zero-filled the gradients in place (set_to_none=False):
    // with one micro-batch a step every gradient of the previous step is still allocated when
    // the next backward starts, 4·Ψ in fp32, as with accumulation. The default, set_to_none,
    // frees them: 4·(ROOT + BLOCK) at the first block back (above).
    let p = problem("gpt2", "A100-80GB", 1, 1, 1024, 8).with_framework(Framework::Fsdp);
    let s = chunked(1);
    let freed = evaluate(&p.clone().with_zero_grad(ZeroGrad::SetToNone), &s);
    let filled = evaluate(&p.with_zero_grad(ZeroGrad::ZeroFill), &s);
    assert_eq!(at(&freed, Category::Gradient), 4.0 * (ROOT + BLOCK));
    assert_eq!(at(&filled, Category::Gradient), 4.0 * PSI);
}
