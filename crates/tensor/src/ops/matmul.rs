//! Matrix multiply: `(…, M, K) @ (…, K, N) -> (…, M, N)` with broadcast batch dims. A rank-2
//! right operand with a batched left operand (a linear layer) folds the batch into M, so the
//! weight is one gemm operand and its gradient one gemm, not a sum over batches.
//!
//! `linear` is a matmul plus a bias, as one autocast unit: under autocast all three operands
//! are lowered (PyTorch's `linear`/`addmm` are on its lower-precision list), so the 16-bit
//! product is not widened back to f32 to meet an f32 bias.
//!
//! Not for: the gemm calls (see `backend::cpu::matmul`).

use crate::autocast;
use crate::backprop::Op;
use crate::error::{Result, TensorError};
use crate::ops::{float_only, same_dtype};
use crate::shape::broadcast_shapes;
use crate::tape::{record, will_record};
use crate::tensor::Tensor;

/// Whether `x @ w + b` can add its bias in the product's store: `x` (…, K) of rank 2 or more,
/// `w` (K, N), `b` (N), all of one float dtype.
pub(crate) fn fusable_bias(x: &Tensor, w: &Tensor, b: &Tensor) -> bool {
    let r = x.rank();
    r >= 2
        && w.rank() == 2
        && x.shape()[r - 1] == w.shape()[0]
        && b.shape() == [w.shape()[1]]
        && x.dtype() == w.dtype()
        && b.dtype() == w.dtype()
        && x.dtype().is_float()
}

impl Tensor {
    /// `self @ w + b`: a linear layer with weight `(K, N)` and bias `(N)`. Under autocast the
    /// input, weight and bias are all cast to the autocast dtype and so is the output.
    ///
    /// One op where the kernel can add the bias while storing the product (`matmul_bias`):
    /// a weight of rank 2, a bias of its N values, one float dtype. The bits are those of
    /// `matmul` then `add`, and so are the gradients (the op's backward is theirs), but the
    /// output is written once and no second (…, N) tensor is allocated.
    pub fn linear(&self, w: &Tensor, b: &Tensor) -> Result<Tensor> {
        if let Some((x, w)) = autocast::lower_pair(self, w)? {
            return x.linear(&w, b);
        }
        let b = autocast::lower_bias(b)?;
        let ra = self.rank();
        if !fusable_bias(self, w, &b) {
            return self.matmul(w)?.add(&b);
        }
        if ra > 2 {
            // (B, T, K) @ (K, N) + (N): fold to (B·T, K), as `matmul` does.
            let lead = &self.shape()[..ra - 1];
            let k = self.shape()[ra - 1];
            let folded = self.reshape(&[lead.iter().product(), k])?.linear(w, &b)?;
            let mut out_shape = lead.to_vec();
            out_shape.push(w.shape()[1]);
            return folded.reshape(&out_shape);
        }
        let (m, n) = (self.shape()[0], w.shape()[1]);
        let out = Tensor::empty(&self.device(), &[m, n], self.dtype(), "linear")?;
        self.backend()
            .matmul_bias(&self.src(), &w.src(), &b.src(), &mut out.dst())?;
        let keep = will_record(&[self, w]);
        Ok(record(out, &[self, w, &b], || Op::Linear {
            a: (keep && w.requires_grad()).then(|| self.clone()),
            b: (keep && self.requires_grad()).then(|| w.clone()),
            a_shape: self.shape().to_vec(),
            b_shape: w.shape().to_vec(),
            bias_shape: b.shape().to_vec(),
        }))
    }

    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        if let Some((a, b)) = autocast::lower_pair(self, rhs)? {
            return a.matmul(&b);
        }
        same_dtype("matmul", self, rhs)?;
        float_only("matmul", self)?;
        let (ra, rb) = (self.rank(), rhs.rank());
        let mismatch = || TensorError::ShapeMismatch {
            op: "matmul",
            lhs: self.shape().to_vec(),
            rhs: rhs.shape().to_vec(),
        };
        if ra < 2 || rb < 2 || self.shape()[ra - 1] != rhs.shape()[rb - 2] {
            return Err(mismatch());
        }
        let (m, k, n) = (
            self.shape()[ra - 2],
            self.shape()[ra - 1],
            rhs.shape()[rb - 1],
        );
        if rb == 2 && ra > 2 {
            // (B, T, K) @ (K, N): fold to (B·T, K) @ (K, N).
            let lead = &self.shape()[..ra - 1];
            let folded = self.reshape(&[lead.iter().product(), k])?.matmul(rhs)?;
            let mut out_shape = lead.to_vec();
            out_shape.push(n);
            return folded.reshape(&out_shape);
        }
        let batch = broadcast_shapes("matmul", &self.shape()[..ra - 2], &rhs.shape()[..rb - 2])?;
        let with =
            |extra: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(extra).collect() };
        let a = self.with_layout(self.layout().broadcast_to(&with([m, k]))?);
        let b = rhs.with_layout(rhs.layout().broadcast_to(&with([k, n]))?);
        let out = Tensor::empty(&self.device(), &with([m, n]), self.dtype(), "matmul")?;
        self.backend().matmul(&a.src(), &b.src(), &mut out.dst())?;
        let keep = will_record(&[self, rhs]);
        Ok(record(out, &[self, rhs], || Op::Matmul {
            a: (keep && rhs.requires_grad()).then(|| self.clone()),
            b: (keep && self.requires_grad()).then(|| rhs.clone()),
            a_shape: self.shape().to_vec(),
            b_shape: rhs.shape().to_vec(),
        }))
    }
}
