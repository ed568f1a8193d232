//! Rotary position embedding (RoFormer, Su et al. 2021), the Llama family's positions: no
//! parameters, only the tables of angles. Pair `i` of a head of `D` features turns at position
//! `p` by `p · base^(−2i/D)` (`base` is a config's `rope_theta`); the tables are built once per
//! forward for its sequence length, on the host in f64 and stored as f32, and every layer's
//! queries and keys are rotated by them (`Tensor::rotary`).
//!
//! Not for: the rotation itself (the tensor crate) or scaled variants of the frequencies.

use headroom_memory::{Category, Device};
use headroom_tensor::{DType, Result, Tensor, TensorError};

/// The frequencies of a rotary embedding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RotaryEmbedding {
    /// Features per head (even).
    pub head_dim: usize,
    /// The base of the frequencies (`rope_theta`; 10,000 in Llama 2).
    pub base: f64,
}

/// The cosines and sines of one sequence length, each f32 `(T, D/2)`.
#[derive(Clone, Debug)]
pub struct RotaryTables {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl RotaryEmbedding {
    /// The tables for positions `0..t`.
    pub fn tables(&self, device: &Device, t: usize) -> Result<RotaryTables> {
        let d = self.head_dim;
        if d == 0 || !d.is_multiple_of(2) || !self.base.is_finite() || self.base <= 0.0 {
            return Err(TensorError::invalid(
                "rotary embedding",
                format!(
                    "needs an even head dimension and a positive base, got {d} and {}",
                    self.base
                ),
            ));
        }
        let half = d / 2;
        let angle =
            |k: usize| (k / half) as f64 * self.base.powf(-2.0 * (k % half) as f64 / d as f64);
        let cos: Vec<f32> = (0..t * half).map(|k| angle(k).cos() as f32).collect();
        let sin: Vec<f32> = (0..t * half).map(|k| angle(k).sin() as f32).collect();
        let table = |v: &[f32], name| {
            Tensor::from_f32(
                device,
                &[t, half],
                v,
                DType::F32,
                Category::Input,
                Some(name),
            )
        };
        Ok(RotaryTables {
            cos: table(&cos, "rotary.cos")?,
            sin: table(&sin, "rotary.sin")?,
        })
    }
}

impl RotaryTables {
    /// `x` `(B, T, H, D)` rotated by position.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        x.rotary(&self.cos, &self.sin)
    }
}
