//! Rotary position embedding (RoFormer, Su et al. 2021) as one op: queries or keys laid out
//! `(…, T, H, D)` rotated pair by pair by the angles of their position, in the "rotate half"
//! layout of the Llama family's Hugging Face implementation (`rotate_half`: pairs `(i, i + D/2)`).
//! It saves nothing for backward: the gradient of a rotation is the inverse rotation of `dy`.
//!
//! Not for: the tables of angles and their frequencies (the nn crate's rotary module).

use crate::backprop::Op;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::{float_only, out_like};
use crate::tape::record;
use crate::tensor::Tensor;

impl Tensor {
    /// `self` `(…, T, H, D)` with each pair `(x[i], x[i + D/2])` at position `p` rotated by the
    /// angle θ with `cos θ = cos[p, i]` and `sin θ = sin[p, i]`: `(x₁ cos θ − x₂ sin θ,
    /// x₂ cos θ + x₁ sin θ)`. `cos` and `sin` are f32 `(T, D/2)` constants (never
    /// differentiated); the output has `self`'s dtype, computed in f32.
    pub fn rotary(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        float_only("rotary", self)?;
        let r = self.rank();
        if r < 3 {
            return Err(TensorError::invalid(
                "rotary",
                format!("input must be (…, T, H, D), got {:?}", self.shape()),
            ));
        }
        let (t, d) = (self.shape()[r - 3], self.shape()[r - 1]);
        if !d.is_multiple_of(2) {
            return Err(TensorError::invalid(
                "rotary",
                format!("the head dimension {d} must be even (features rotate in pairs)"),
            ));
        }
        for table in [cos, sin] {
            if table.dtype() != DType::F32 || table.shape() != [t, d / 2] {
                return Err(TensorError::invalid(
                    "rotary",
                    format!(
                        "cos and sin must be f32 (T, D/2) = ({t}, {}), got {:?} {:?}",
                        d / 2,
                        table.dtype(),
                        table.shape()
                    ),
                ));
            }
        }
        if !self.device().same(&cos.device()) || !self.device().same(&sin.device()) {
            return Err(TensorError::DeviceMismatch { op: "rotary" });
        }
        let (cos, sin) = (cos.detach().contiguous()?, sin.detach().contiguous()?);
        let out = rotate(self, &cos, &sin, false)?;
        Ok(record(out, &[self], || Op::Rotary { cos, sin }))
    }
}

/// `x` rotated (or, `inverse`, rotated back) by the tables; not recorded.
pub(crate) fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, inverse: bool) -> Result<Tensor> {
    let x = x.contiguous()?;
    let out = out_like(&x, "rotary")?;
    x.backend()
        .rope(&x.src(), &cos.src(), &sin.src(), inverse, &mut out.dst())?;
    Ok(out)
}
