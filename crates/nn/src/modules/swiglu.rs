//! The SiLU-gated MLP of the Llama family (SwiGLU, Shazeer 2020):
//! `down(silu(gate(x)) ⊙ up(x))`, slots `{name}.gate` and `{name}.up` (width → hidden) and
//! `{name}.down` (hidden → width).
//!
//! Not for: the GELU MLP (`mlp.rs`).

use super::{Linear, Slot, join};
use headroom_tensor::{Result, Tensor};

/// A bound SwiGLU MLP.
#[derive(Clone, Debug)]
pub struct SwiGlu {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl SwiGlu {
    pub fn slots(name: &str, width: usize, hidden: usize, bias: bool) -> Vec<Slot> {
        let mut slots = Linear::slots(&join(name, "gate"), width, hidden, bias);
        slots.extend(Linear::slots(&join(name, "up"), width, hidden, bias));
        slots.extend(Linear::slots(&join(name, "down"), hidden, width, bias));
        slots
    }

    /// (…, width) → (…, width).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // The fused product keeps the gate and up projections only, not the SiLU output.
        let gated = self.gate.forward(x)?.swiglu(&self.up.forward(x)?)?;
        self.down.forward(&gated)
    }
}
