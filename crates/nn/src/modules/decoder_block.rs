//! A pre-norm decoder block (GPT-2's and the Llama family's): `x + attn(norm₁(x))`, then
//! `+ ffn(norm₂(x))`, with dropout on each branch before its residual add.
//!
//! Not for: the parameter scope a model runs a block in, or checkpoint segments
//! (`model::run_blocks`).

use super::{Attention, LayerNorm, Mlp, RmsNorm, SwiGlu};
use headroom_tensor::{Result, Tensor};

/// A norm of either kind.
#[derive(Clone, Debug)]
pub enum Norm {
    LayerNorm(LayerNorm),
    RmsNorm(RmsNorm),
}

impl Norm {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::LayerNorm(n) => n.forward(x),
            Norm::RmsNorm(n) => n.forward(x),
        }
    }
}

/// A feed-forward layer of either kind.
#[derive(Clone, Debug)]
pub enum FeedForward {
    Mlp(Box<Mlp>),
    SwiGlu(Box<SwiGlu>),
}

impl FeedForward {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            FeedForward::Mlp(m) => m.forward(x),
            FeedForward::SwiGlu(m) => m.forward(x),
        }
    }
}

/// A bound decoder block.
#[derive(Clone, Debug)]
pub struct DecoderBlock {
    pub norm1: Norm,
    pub attention: Attention,
    pub norm2: Norm,
    pub ffn: FeedForward,
    /// Dropout on each branch's output (residual dropout).
    pub dropout: f32,
}

impl DecoderBlock {
    /// (B, T, C) → (B, T, C).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.norm1.forward(x)?;
        let x = x.add(&self.attention.forward(&h)?.dropout(self.dropout)?)?;
        let h = self.norm2.forward(&x)?;
        x.add(&self.ffn.forward(&h)?.dropout(self.dropout)?)
    }
}
