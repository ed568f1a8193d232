//! RMS norm over the last axis (Zhang and Sennrich 2019), the Llama family's norm:
//! `x / √(mean(x²) + ε) · w`, one gain slot `{name}.w` of the width and no bias.
//!
//! Not for: layer norm (`layer_norm.rs`).

use super::{Naming, Slot, Weights, join};
use headroom_tensor::{Result, Tensor};

/// A bound RMS norm.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    pub w: Tensor,
    pub eps: f32,
}

impl RmsNorm {
    pub fn slots(name: &str, width: usize) -> Vec<Slot> {
        RmsNorm::slots_as(Naming::Short, name, width)
    }

    /// [`RmsNorm::slots`] under `naming` (`{name}.weight` for Hugging Face's).
    pub fn slots_as(naming: Naming, name: &str, width: usize) -> Vec<Slot> {
        vec![Slot::new(join(name, naming.weight()), &[width])]
    }

    pub fn load(w: &Weights, name: &str, eps: f32) -> Result<RmsNorm> {
        RmsNorm::load_as(Naming::Short, w, name, eps)
    }

    /// [`RmsNorm::load`] under `naming`.
    pub fn load_as(naming: Naming, w: &Weights, name: &str, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            w: w.pp(name).get(naming.weight())?,
            eps,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.rms_norm(&self.w, self.eps)
    }
}
