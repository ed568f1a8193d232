//! Layer norm over the last axis (Ba et al. 2016) with a gain and a bias: slots `{name}.w` and
//! `{name}.b`, both of the width.
//!
//! Not for: RMS norm (`rms_norm.rs`).

use super::{Slot, Weights, join};
use headroom_tensor::{Result, Tensor};

/// A bound layer norm.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub w: Tensor,
    pub b: Tensor,
    pub eps: f32,
}

impl LayerNorm {
    pub fn slots(name: &str, width: usize) -> Vec<Slot> {
        vec![
            Slot::new(join(name, "w"), &[width]),
            Slot::new(join(name, "b"), &[width]),
        ]
    }

    pub fn load(w: &Weights, name: &str, eps: f32) -> Result<LayerNorm> {
        let w = w.pp(name);
        Ok(LayerNorm {
            w: w.get("w")?,
            b: w.get("b")?,
            eps,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(&self.w, &self.b, self.eps)
    }
}
