//! GELU followed by a linear layer, `gelu(x) @ w + b`, recorded as one op that saves only the
//! pre-activation `x`: the GELU output, as large as `x`, is recomputed from it in backward
//! (where the weight gradient needs it) instead of being kept from forward to backward. This
//! is the choice of PyTorch's compiler (AOTAutograd's min-cut partitioner recomputes cheap
//! pointwise ops rather than saving their outputs; docs/sources.md §22). The values are the
//! composition's, bit for bit: forward and backward run the same kernels in the same order.
//!
//! Not for: GELU or matmul alone (see `elementwise`, `matmul`).

use crate::autocast;
use crate::backprop::Op;
use crate::context::no_grad;
use crate::error::Result;
use crate::ops::matmul::fusable_bias;
use crate::ops::{float_only, out_like, same_dtype};
use crate::tape::{record, will_record};
use crate::tensor::Tensor;

impl Tensor {
    /// `gelu(self) @ w`, saving only `self` for backward (the GELU output is recomputed there).
    /// Under autocast with operands the policy would cast, it is the plain composition.
    pub fn gelu_matmul(&self, w: &Tensor) -> Result<Tensor> {
        if autocast::autocast_dtype().is_some_and(|low| self.dtype() != low || w.dtype() != low) {
            return self.gelu()?.matmul(w);
        }
        float_only("gelu_matmul", self)?;
        same_dtype("gelu_matmul", self, w)?;
        let r = self.rank();
        if r > 2 && w.rank() == 2 {
            // (B, T, K) @ (K, N): fold to (B·T, K) as `matmul` does, so the weight gradient
            // is the same single gemm (and the same sums) as the composition's.
            let lead = &self.shape()[..r - 1];
            let folded = self.reshape(&[lead.iter().product(), self.shape()[r - 1]])?;
            let mut out_shape = lead.to_vec();
            out_shape.push(w.shape()[1]);
            return folded.gelu_matmul(w)?.reshape(&out_shape);
        }
        let out = no_grad(|| self.gelu()?.matmul(w))?;
        let keep = will_record(&[self, w]);
        Ok(record(out, &[self, w], || Op::GeluMatmul {
            x: self.clone(),
            w: (keep && self.requires_grad()).then(|| w.clone()),
            w_shape: w.shape().to_vec(),
            bias_shape: None,
        }))
    }

    /// `gelu(self) @ w + b`: [`Tensor::gelu_matmul`] plus a bias, the bias lowered under
    /// autocast as in [`Tensor::linear`] and, where `linear` fuses it, added while the product
    /// is stored (the bits of the separate add, one output tensor).
    pub fn gelu_linear(&self, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        let b = autocast::lower_bias(b)?;
        let casts =
            autocast::autocast_dtype().is_some_and(|low| self.dtype() != low || w.dtype() != low);
        let r = self.rank();
        if casts || !fusable_bias(self, w, &b) {
            return self.gelu_matmul(w)?.add(&b);
        }
        if r > 2 {
            let lead = &self.shape()[..r - 1];
            let folded = self.reshape(&[lead.iter().product(), self.shape()[r - 1]])?;
            let mut out_shape = lead.to_vec();
            out_shape.push(w.shape()[1]);
            return folded.gelu_linear(w, &b)?.reshape(&out_shape);
        }
        let out = no_grad(|| self.gelu()?.linear(w, &b))?;
        let keep = will_record(&[self, w]);
        Ok(record(out, &[self, w, &b], || Op::GeluMatmul {
            x: self.clone(),
            w: (keep && self.requires_grad()).then(|| w.clone()),
            w_shape: w.shape().to_vec(),
            bias_shape: Some(b.shape().to_vec()),
        }))
    }
}

/// The gradients of `x` (when `w` was saved, i.e. `x` needs one) and of the weight (when
/// `want_w`): `dg = dy @ wᵀ`, then one pass for `dx = dg ⊙ gelu'(x)` and the recomputed
/// `g = gelu(x)`, then `dw = gᵀ @ dy` — the composition's kernels, so its bits.
pub(crate) fn gelu_matmul_backward(
    x: &Tensor,
    w: Option<&Tensor>,
    w_shape: &[usize],
    dy: &Tensor,
    want_w: bool,
) -> Result<Vec<Option<Tensor>>> {
    let (dx, g) = match w {
        Some(w) => {
            // dg is this rule's own fresh buffer: GELU's gradient overwrites it.
            let dx = dy
                .matmul(&w.transpose(-1, -2)?)?
                .sum_to(x.shape())?
                .contiguous()?;
            let x = x.contiguous()?;
            let g = out_like(&x, "gelu")?;
            x.backend()
                .gelu_backward_with_output(&x.src(), &mut dx.dst(), &mut g.dst())?;
            (Some(dx), g)
        }
        None => (None, x.gelu()?),
    };
    let dw = want_w
        .then(|| g.transpose(-1, -2)?.matmul(dy)?.sum_to(w_shape))
        .transpose()?;
    Ok(vec![dx, dw])
}
