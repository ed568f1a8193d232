//! One GPT block: the layout of its twelve weights (and GPT-2's initialisation of them), and
//! its forward — pre-norm causal self-attention and a GELU MLP with residual connections — over
//! views of its weights, with LoRA adapters' updates and QLoRA's NF4 projections where the
//! model has them.
//!
//! Not for: the model around the blocks (see `mod.rs`).

use super::super::lora::BlockAdapters;
use super::super::qlora::QUANTIZED;
use crate::init::Init;
use headroom_strategy::{Attention, LoraTarget};
use headroom_tensor::{Nf4Weight, Result, Tensor, checkpoint, param_scope};
use std::sync::Arc;

/// GPT-2's initialisation: normal(0, 0.02) weights, zero biases, unit norm gains.
pub(super) fn gpt2_init(name: &str) -> Init {
    if name.ends_with(".b") {
        Init::Zeros
    } else if name.starts_with("ln") {
        Init::Ones
    } else {
        Init::Normal(0.02)
    }
}

/// The shapes of a block's weights in `BLOCK_WEIGHTS` order, for width `c` and MLP width `f`.
pub(super) fn block_shapes(c: usize, f: usize) -> [Vec<usize>; 12] {
    [
        vec![c],
        vec![c],
        vec![c, 3 * c],
        vec![3 * c],
        vec![c, c],
        vec![c],
        vec![c],
        vec![c],
        vec![c, f],
        vec![f],
        vec![f, c],
        vec![c],
    ]
}

/// A block's weights as `(name, shape)` pairs in `BLOCK_WEIGHTS` order.
pub(super) fn block_weights(shapes: &[Vec<usize>; 12]) -> Vec<(&'static str, &[usize])> {
    BLOCK_WEIGHTS
        .iter()
        .copied()
        .zip(shapes.iter().map(|s| s.as_slice()))
        .collect()
}

pub(super) const BLOCK_WEIGHTS: [&str; 12] = [
    "ln1.w",
    "ln1.b",
    "attn.qkv.w",
    "attn.qkv.b",
    "attn.proj.w",
    "attn.proj.b",
    "ln2.w",
    "ln2.b",
    "mlp.fc.w",
    "mlp.fc.b",
    "mlp.proj.w",
    "mlp.proj.b",
];

/// Views of one block's weights, cheap to clone into a checkpoint scope.
#[derive(Clone)]
pub(super) struct BlockParams {
    /// The block's index in the model's block list.
    pub(super) index: usize,
    /// The weights held as tensors, by name (all twelve, or QLoRA's eight unquantised).
    pub(super) w: Vec<(&'static str, Tensor)>,
    /// QLoRA's NF4 projections, in `QUANTIZED` order (empty otherwise).
    pub(super) nf4: Vec<Arc<Nf4Weight>>,
    pub(super) heads: usize,
    pub(super) dropout: f32,
    /// Recompute the attention core (scores, softmax, dropout, weighted sum) in backward.
    pub(super) selective: bool,
    pub(super) attention: Attention,
    /// The block's LoRA adapters, if any.
    pub(super) adapters: Option<BlockAdapters>,
}

/// Scores, causal mask, softmax, dropout and the weighted sum of values: (B, H, T, D) each.
/// The memory-heavy part of attention (its saved tensors are s² per head).
fn core_attention(q: &Tensor, k: &Tensor, v: &Tensor, dropout: f32) -> Result<Tensor> {
    let hd = q.shape()[3];
    let scores = q.matmul(&k.transpose(-2, -1)?)?; // (B, H, T, T)
    // Scale, causal mask and softmax in one op (the bits of the three, half the work).
    let att = scores
        .causal_softmax(1.0 / (hd as f32).sqrt())?
        .dropout(dropout)?;
    att.matmul(v) // (B, H, T, D)
}

impl BlockParams {
    fn get(&self, name: &str) -> &Tensor {
        &self
            .w
            .iter()
            .find(|(n, _)| *n == name)
            .expect("a weight the block holds")
            .1
    }

    /// Weight `name` in NF4, under QLoRA.
    fn nf4(&self, name: &str) -> Option<&Arc<Nf4Weight>> {
        let i = QUANTIZED.iter().position(|q| *q == name)?;
        self.nf4.get(i)
    }

    /// Causal self-attention: (B, T, C) → (B, T, C), scores materialised.
    fn attention(&self, h: &Tensor) -> Result<Tensor> {
        let (b, t, c) = (h.shape()[0], h.shape()[1], h.shape()[2]);
        let (nh, hd) = (self.heads, c / self.heads);
        let qkv = self.project(h, "attn.qkv", LoraTarget::Qkv)?; // (B, T, 3C)
        let split = |i: usize, target: LoraTarget| -> Result<Tensor> {
            let part = qkv.narrow(2, i * c, c)?;
            let part = match &self.adapters {
                Some(a) => a.add_update(target, h, part)?,
                None => part,
            };
            part.reshape(&[b, t, nh, hd])?.permute(&[0, 2, 1, 3]) // (B, H, T, D)
        };
        let (q, k, v) = (
            split(0, LoraTarget::Q)?,
            split(1, LoraTarget::K)?,
            split(2, LoraTarget::V)?,
        );
        let y = if self.attention == Attention::MemoryEfficient {
            // Fused: saves q, k, v, y and a (B, H, T) statistic only, so there is nothing
            // T×T for selective recomputation to drop.
            let scale = 1.0 / (hd as f32).sqrt();
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
        self.project(&y, "attn.proj", LoraTarget::O)?
            .dropout(self.dropout)
    }

    /// `x·W + b` for weight `{name}.w`, plus the adapter's update when `target` has one.
    fn project(&self, x: &Tensor, name: &str, target: LoraTarget) -> Result<Tensor> {
        let (w, b) = (format!("{name}.w"), format!("{name}.b"));
        let y = match self.nf4(&w) {
            Some(q) => x.linear_nf4(q, self.get(&b))?,
            None => x.linear(self.get(&w), self.get(&b))?,
        };
        match &self.adapters {
            Some(a) => a.add_update(target, x, y),
            None => Ok(y),
        }
    }

    /// The block inside its parameter scope (gathered there under ZeRO-3).
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        param_scope(&[self.index], x, |x| self.compute(x))
    }

    /// x + attn(ln1(x)), then + mlp(ln2(x)).
    fn compute(&self, x: &Tensor) -> Result<Tensor> {
        let h = x.layer_norm(self.get("ln1.w"), self.get("ln1.b"), 1e-5)?;
        let x = x.add(&self.attention(&h)?)?;
        let h = x.layer_norm(self.get("ln2.w"), self.get("ln2.b"), 1e-5)?;
        let fc = self.project(&h, "mlp.fc", LoraTarget::Up)?; // (B, T, F)
        // GELU's (B, T, F) output is recomputed in backward, never saved (under every policy)
        // unless an adapter on the down projection reads it.
        let b = self.get("mlp.proj.b");
        let down = self
            .adapters
            .as_ref()
            .filter(|a| a.adapts(LoraTarget::Down));
        let m = match (self.nf4("mlp.proj.w"), down) {
            // An NF4 projection saves nothing, so GELU's output is not kept for it either.
            (Some(q), _) => {
                let g = fc.gelu()?;
                let m = g.linear_nf4(q, b)?;
                match down {
                    Some(a) => a.add_update(LoraTarget::Down, &g, m)?,
                    None => m,
                }
            }
            (None, Some(a)) => {
                let m = fc.gelu_linear(self.get("mlp.proj.w"), b)?;
                a.add_update(LoraTarget::Down, &fc.gelu()?, m)?
            }
            (None, None) => fc.gelu_linear(self.get("mlp.proj.w"), b)?,
        };
        x.add(&m.dropout(self.dropout)?)
    }
}
