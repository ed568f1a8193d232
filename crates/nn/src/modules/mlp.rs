//! The transformer's GELU MLP (GPT-2's): `W₂·gelu(W₁·x + b₁) + b₂`, slots `{name}.fc` (width →
//! hidden) and `{name}.proj` (hidden → width). The GELU output is recomputed in backward, not
//! saved (`Linear::forward_gelu`).
//!
//! Not for: the gated MLP of the Llama family (`swiglu.rs`).

use super::{Linear, Slot, join};
use headroom_tensor::{Result, Tensor};

/// A bound GELU MLP.
#[derive(Clone, Debug)]
pub struct Mlp {
    pub fc: Linear,
    pub proj: Linear,
}

impl Mlp {
    pub fn slots(name: &str, width: usize, hidden: usize, bias: bool) -> Vec<Slot> {
        let mut slots = Linear::slots(&join(name, "fc"), width, hidden, bias);
        slots.extend(Linear::slots(&join(name, "proj"), hidden, width, bias));
        slots
    }

    /// (…, width) → (…, width).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let pre = self.fc.forward(x)?; // (…, hidden)
        self.proj.forward_gelu(&pre)
    }
}
