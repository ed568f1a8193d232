//! Layout ops: reshape, permute/transpose, narrow (slicing), broadcast — all views sharing the
//! input's storage — plus the ops that copy: contiguous, concatenation and dtype casts.
//!
//! Not for: arithmetic (see `elementwise`).

use crate::backprop::Op;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::copy_into;
use crate::shape::{numel, resolve_axis};
use crate::tape::record;
use crate::tensor::Tensor;

impl Tensor {
    /// The same elements under `shape` (a view when contiguous, else a copy first).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if numel(shape) != self.numel() {
            return Err(TensorError::ShapeMismatch {
                op: "reshape",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
            });
        }
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let base = self.contiguous()?;
        let layout = base
            .layout()
            .reshape(shape)
            .expect("contiguous layouts reshape to any shape of equal numel");
        let out = base.with_layout(layout);
        Ok(record(out, &[&base], || Op::Reshape {
            in_shape: base.shape().to_vec(),
        }))
    }

    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let out = self.with_layout(self.layout().permute(perm)?);
        Ok(record(out, &[self], || Op::Permute {
            perm: perm.to_vec(),
        }))
    }

    /// Swaps two axes (negative axes count from the end).
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (a, b) = (
            resolve_axis("transpose", a, self.rank())?,
            resolve_axis("transpose", b, self.rank())?,
        );
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Elements `start..start + len` along `axis` (a view).
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let axis = resolve_axis("narrow", axis, self.rank())?;
        let out = self.with_layout(self.layout().narrow(axis, start, len)?);
        Ok(record(out, &[self], || Op::Narrow {
            in_shape: self.shape().to_vec(),
            axis,
            start,
        }))
    }

    /// A stride-0 view expanded to `shape`.
    pub fn broadcast_as(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let out = self.with_layout(self.layout().broadcast_to(shape)?);
        Ok(record(out, &[self], || Op::Broadcast {
            in_shape: self.shape().to_vec(),
        }))
    }

    /// Each element repeated `n` times in a row along `axis` (PyTorch's `repeat_interleave`
    /// with a scalar count): grouped-query attention's sharing of a key/value head by `n`
    /// query heads. A broadcast view made contiguous; its gradient sums the `n` copies.
    pub fn repeat_interleave(&self, axis: isize, n: usize) -> Result<Tensor> {
        let axis = resolve_axis("repeat_interleave", axis, self.rank())?;
        if n == 0 {
            return Err(TensorError::invalid(
                "repeat_interleave",
                "the count must be at least 1",
            ));
        }
        if n == 1 {
            return Ok(self.clone());
        }
        let shape = self.shape();
        let mut single = shape[..=axis].to_vec();
        single.push(1);
        single.extend_from_slice(&shape[axis + 1..]);
        let mut wide = single.clone();
        wide[axis + 1] = n;
        let mut out = shape.to_vec();
        out[axis] *= n;
        self.reshape(&single)?.broadcast_as(&wide)?.reshape(&out)
    }

    /// This tensor with a contiguous layout (itself when already contiguous).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = self.contiguous_copy()?;
        Ok(record(out, &[self], || Op::Contiguous))
    }

    /// This tensor converted to `dtype` (itself when already of that dtype).
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        if !dtype.is_float() || !self.dtype().is_float() {
            return Err(TensorError::UnsupportedDType { op: "cast", dtype });
        }
        let out = Tensor::empty(&self.device(), self.shape(), dtype, "cast")?;
        self.backend().copy(&self.src(), &mut out.dst())?;
        Ok(record(out, &[self], || Op::Cast { from: self.dtype() }))
    }

    /// Concatenation along `axis`; all other dims must match.
    pub fn cat(tensors: &[&Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| TensorError::invalid("cat", "no tensors to concatenate"))?;
        let axis = resolve_axis("cat", axis, first.rank())?;
        let mut shape = first.shape().to_vec();
        shape[axis] = 0;
        for t in tensors {
            crate::ops::same_dtype("cat", first, t)?;
            let same_rest = t.rank() == first.rank()
                && (0..t.rank()).all(|i| i == axis || t.shape()[i] == first.shape()[i]);
            if !same_rest {
                return Err(TensorError::ShapeMismatch {
                    op: "cat",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            shape[axis] += t.shape()[axis];
        }
        let out = Tensor::empty(&first.device(), &shape, first.dtype(), "cat")?;
        let mut start = 0;
        for t in tensors {
            let len = t.shape()[axis];
            copy_into(t, &out.with_layout(out.layout().narrow(axis, start, len)?))?;
            start += len;
        }
        let sizes = tensors.iter().map(|t| t.shape()[axis]).collect();
        Ok(record(out, tensors, || Op::Cat { axis, sizes }))
    }

    /// Zeros of `shape` with this tensor written at `start` along `axis` (narrow's gradient).
    pub(crate) fn pad_into(&self, shape: &[usize], axis: usize, start: usize) -> Result<Tensor> {
        let out = Tensor::empty(&self.device(), shape, self.dtype(), "pad")?;
        out.fill_(0.0)?;
        copy_into(
            self,
            &out.with_layout(out.layout().narrow(axis, start, self.shape()[axis])?),
        )?;
        Ok(out)
    }
}
