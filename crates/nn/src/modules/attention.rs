//! Causal multi-head self-attention (Vaswani et al. 2017): project to queries, keys and values
//! (one fused projection, GPT-2's, or three, the Llama family's), split into heads, attend, merge
//! the heads and project out. The attention core is naive (scores materialised; under
//! selective recomputation recomputed in backward, Korthikanti et al. 2022) or memory-efficient
//! (the fused kernel, `Tensor::attention`).
//!
//! Not for: the kernels (the tensor crate) or the residual around the layer (`decoder_block.rs`).

use super::lora_adapter::adapted;
use super::{Linear, LoraAdapter, Slot};
use headroom_strategy::Attention as AttentionKind;
use headroom_tensor::{Result, Tensor, TensorError, checkpoint};

/// The sizes of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// The model width (input and output features).
    pub width: usize,
    pub heads: usize,
    /// Whether the projections have biases.
    pub bias: bool,
}

impl AttentionShape {
    /// Features per head.
    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    /// The slots of a fused layer: `{name}.{qkv}` (width × 3·width) and `{name}.{out}`.
    pub fn fused_slots(&self, name: &str, qkv: &str, out: &str) -> Vec<Slot> {
        let c = self.width;
        let mut slots = Linear::slots(&super::join(name, qkv), c, 3 * c, self.bias);
        slots.extend(Linear::slots(&super::join(name, out), c, c, self.bias));
        slots
    }

    /// The slots of a layer with separate projections, named `[q, k, v, out]`.
    pub fn separate_slots(&self, name: &str, names: [&str; 4]) -> Vec<Slot> {
        let c = self.width;
        names
            .iter()
            .flat_map(|n| Linear::slots(&super::join(name, n), c, c, self.bias))
            .collect()
    }
}

/// How queries, keys and values are projected.
#[derive(Clone, Debug)]
pub enum QkvProjection {
    /// One (width × 3·width) projection split into thirds; each third may have its own adapter
    /// (LoRA on q, k or v of a fused projection).
    Fused {
        qkv: Linear,
        parts: [Option<LoraAdapter>; 3],
    },
    /// Three projections (each with its own adapter, if any).
    Separate { q: Linear, k: Linear, v: Linear },
}

/// A bound causal self-attention layer.
#[derive(Clone, Debug)]
pub struct Attention {
    pub shape: AttentionShape,
    pub qkv: QkvProjection,
    pub out: Linear,
    pub kind: AttentionKind,
    /// Dropout on the attention probabilities.
    pub dropout: f32,
    /// Recompute the naive core (scores, softmax, dropout, weighted sum) in backward.
    pub selective: bool,
}

/// Scores, causal mask, softmax, dropout and the weighted sum of values: (B, H, T, D) each.
/// The memory-heavy part of attention (its saved tensors are T² per head).
fn core_attention(q: &Tensor, k: &Tensor, v: &Tensor, dropout: f32) -> Result<Tensor> {
    let hd = q.shape()[3];
    let scores = q.matmul(&k.transpose(-2, -1)?)?; // (B, H, T, T)
    // Scale, causal mask and softmax in one op (the bits of the three, half the work).
    let att = scores
        .causal_softmax(1.0 / (hd as f32).sqrt())?
        .dropout(dropout)?;
    att.matmul(v) // (B, H, T, D)
}

impl Attention {
    /// (B, T, H·D) → (B, H, T, D).
    fn heads(&self, x: Tensor, b: usize, t: usize) -> Result<Tensor> {
        let (nh, hd) = (self.shape.heads, self.shape.head_dim());
        x.reshape(&[b, t, nh, hd])?.permute(&[0, 2, 1, 3])
    }

    /// Queries, keys and values of `h`, each (B, H, T, D).
    fn project(&self, h: &Tensor, b: usize, t: usize) -> Result<[Tensor; 3]> {
        match &self.qkv {
            QkvProjection::Fused { qkv, parts } => {
                let c = self.shape.width;
                let all = qkv.forward(h)?; // (B, T, 3C)
                let split = |i: usize| -> Result<Tensor> {
                    let part = adapted(parts[i].as_ref(), h, all.narrow(2, i * c, c)?)?;
                    self.heads(part, b, t)
                };
                Ok([split(0)?, split(1)?, split(2)?])
            }
            QkvProjection::Separate { q, k, v } => Ok([
                self.heads(q.forward(h)?, b, t)?,
                self.heads(k.forward(h)?, b, t)?,
                self.heads(v.forward(h)?, b, t)?,
            ]),
        }
    }

    /// (B, T, C) → (B, T, C).
    pub fn forward(&self, h: &Tensor) -> Result<Tensor> {
        if h.rank() != 3 || h.shape()[2] != self.shape.width {
            return Err(TensorError::invalid(
                "attention",
                format!(
                    "input must be (B, T, {}), got {:?}",
                    self.shape.width,
                    h.shape()
                ),
            ));
        }
        let (b, t, c) = (h.shape()[0], h.shape()[1], h.shape()[2]);
        let [q, k, v] = self.project(h, b, t)?;
        let y = if self.kind == AttentionKind::MemoryEfficient {
            // Fused: saves q, k, v, y and a (B, H, T) statistic only, so there is nothing
            // T×T for selective recomputation to drop.
            let scale = 1.0 / (self.shape.head_dim() as f32).sqrt();
            Tensor::attention(&q, &k, &v, true, scale, self.dropout)? // (B, H, T, D)
        } else if self.selective {
            let p = self.dropout;
            checkpoint(&[&q, &k, &v], move |t| {
                core_attention(&t[0], &t[1], &t[2], p)
            })?
        } else {
            core_attention(&q, &k, &v, self.dropout)?
        };
        let y = y.permute(&[0, 2, 1, 3])?.reshape(&[b, t, c])?; // (B, T, C)
        self.out.forward(&y)
    }
}
