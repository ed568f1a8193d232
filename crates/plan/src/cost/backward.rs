//! The blocks' backward pass when no parameter gradient exists before it (PyTorch's
//! `zero_grad(set_to_none=True)` with one micro-batch a step): each block's gradients are made
//! as its saved activations are released, so the pass never holds every gradient beside every
//! activation.
//!
//! Running block k from the top (k = 0 … n − 1), the device holds the saved activations of the
//! n − k blocks not yet run back (block k's own until its backward ends) and the gradients of
//! the k + 1 blocks run back so far. With blocks of equal size that is linear in k, so the
//! fullest moment is at one end: the first block back (n blocks' activations, one block's
//! gradients) or the last (one block's activations, n blocks' gradients). The autograd engine
//! frees a node's saved tensors once it has run (`torch/csrc/autograd/engine.cpp`, saved
//! variables released after `call_function` unless `retain_graph`), and AccumulateGrad gives
//! each parameter its `.grad` when its block's weight gradients are computed.
//!
//! Not for: the loss's node (the first of backward, `memory::predict`) or model states.

use super::ModelFacts;

/// The share of the trained parameters inside the transformer blocks, whose gradients the
/// blocks' backward makes: LoRA adapters all sit in blocks; otherwise everything but the
/// embeddings, the final norm and an untied head.
pub fn block_share(facts: &ModelFacts) -> f64 {
    if facts.lora.is_some() || facts.params == 0 {
        return 1.0;
    }
    let blocks = facts.params.saturating_sub(facts.root_params);
    blocks as f64 / facts.params as f64
}

/// The blocks' activations and gradients at the fullest moment of their backward, given what
/// the `blocks` hold in all when it starts (`held`) and the gradients they make (`gradients`).
pub fn fullest(blocks: u64, held: f64, gradients: f64) -> (f64, f64) {
    if blocks == 0 {
        return (held, gradients);
    }
    let n = blocks as f64;
    let (a, g) = (held / n, gradients / n);
    match n * a + g >= a + n * g {
        true => (n * a, g),
        false => (a, n * g),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_dominate_at_the_first_block_back() {
        // 4 blocks of 10 activation bytes and 3 gradient bytes: first block back holds
        // 40 + 3 = 43, the last 10 + 12 = 22, against 40 + 12 = 52 if both were held whole.
        assert_eq!(fullest(4, 40.0, 12.0), (40.0, 3.0));
    }

    #[test]
    fn gradients_dominate_at_the_last_block_back() {
        // 4 blocks of 2 activation bytes and 10 gradient bytes: 8 + 10 = 18 first, 2 + 40 = 42
        // last.
        assert_eq!(fullest(4, 8.0, 40.0), (2.0, 40.0));
    }

    #[test]
    fn one_block_holds_both_whole() {
        assert_eq!(fullest(1, 7.0, 5.0), (7.0, 5.0));
        assert_eq!(fullest(0, 7.0, 5.0), (7.0, 5.0));
    }
}
