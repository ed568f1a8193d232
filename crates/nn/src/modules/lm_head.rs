//! The output head of a language model: the projection to the vocabulary and its mean
//! cross-entropy, computed in f32 whatever the compute dtype, whole or in chunks of tokens
//! (`Tensor::linear_cross_entropy`). Its weight is its own slot `{name}.w` (width × vocab) or
//! the token embedding's table transposed (tied).
//!
//! Not for: the final norm before it (the model composes that).

use super::{Embedding, Slot, Weights, join};
use headroom_tensor::{Result, Tensor};

/// A bound output head.
#[derive(Clone, Debug)]
pub struct LmHead {
    /// (width × vocab).
    pub w: Tensor,
}

impl LmHead {
    pub fn slots(name: &str, width: usize, vocab: usize) -> Vec<Slot> {
        vec![Slot::new(join(name, "w"), &[width, vocab])]
    }

    pub fn load(w: &Weights, name: &str) -> Result<LmHead> {
        Ok(LmHead {
            w: w.pp(name).get("w")?,
        })
    }

    /// The head tied to `embedding`: its table transposed, a view.
    pub fn tied(embedding: &Embedding) -> Result<LmHead> {
        Ok(LmHead {
            w: embedding.table.transpose(0, 1)?,
        })
    }

    /// Mean cross-entropy of `x·W` (…, vocab) against integer `targets` (…), in `chunks`
    /// chunks of tokens (0 or 1: whole).
    pub fn loss(&self, x: &Tensor, targets: &Tensor, chunks: usize) -> Result<Tensor> {
        x.linear_cross_entropy(&self.w, targets, chunks)
    }
}
