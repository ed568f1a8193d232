//! The SiLU-gated product of the Llama family's MLP (SwiGLU, Shazeer 2020), `silu(gate) ⊙ up`,
//! recorded as one op that saves only its two inputs: the SiLU output, as large as either, is
//! recomputed in backward instead of kept (the composition `silu` then `mul` keeps the gate, its
//! SiLU and the up projection). The values are the composition's, bit for bit: the product with
//! the SiLU (forward, and the up projection's gradient) is one pass (`BinaryOp::SiluMul`) that
//! rounds the SiLU to the storage dtype before multiplying, as storing it would.
//!
//! Not for: SiLU alone (`elementwise`) or the projections around it (the nn crate's `SwiGlu`).

use crate::autocast;
use crate::backend::{BinaryOp, UnaryOp};
use crate::backprop::Op;
use crate::error::{Result, TensorError};
use crate::ops::{float_only, same_dtype};
use crate::tape::record;
use crate::tensor::Tensor;

impl Tensor {
    /// `silu(gate) ⊙ up` for same-shaped `gate` (self) and `up`, saving only the two inputs.
    /// Under autocast with mixed dtypes both run in f32, as `mul` promotes.
    pub fn swiglu(&self, up: &Tensor) -> Result<Tensor> {
        if let Some((g, u)) = autocast::promote_pair(self, up)? {
            return g.swiglu(&u);
        }
        float_only("swiglu", self)?;
        same_dtype("swiglu", self, up)?;
        if self.shape() != up.shape() {
            return Err(TensorError::ShapeMismatch {
                op: "swiglu",
                lhs: self.shape().to_vec(),
                rhs: up.shape().to_vec(),
            });
        }
        let out = self.binary_raw(BinaryOp::SiluMul, up)?;
        Ok(record(out, &[self, up], || Op::SwiGlu {
            gate: self.clone(),
            up: self.requires_grad().then(|| up.clone()),
        }))
    }
}

/// The gradients of gate and up (those wanted) from `dy`: `d_up = dy ⊙ silu(gate)` and
/// `d_gate = silu'(gate) ⊙ (dy ⊙ up)`, the SiLU recomputed.
pub(crate) fn swiglu_backward(
    gate: &Tensor,
    up: Option<&Tensor>,
    dy: &Tensor,
    want_up: bool,
) -> Result<Vec<Option<Tensor>>> {
    let d_gate = match up {
        Some(up) => {
            let d_silu = dy.binary_raw(BinaryOp::Mul, up)?;
            Some(gate.binary_raw(BinaryOp::UnaryGrad(UnaryOp::Silu), &d_silu)?)
        }
        None => None,
    };
    let d_up = match want_up {
        // dy · silu(gate) = silu(gate) · dy: the product commutes, bit for bit.
        true => Some(gate.binary_raw(BinaryOp::SiluMul, dy)?),
        false => None,
    };
    Ok(vec![d_gate, d_up])
}
