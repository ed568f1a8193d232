//! Tensor ops: forward computation through the backend and, for each, the record of what its
//! backward needs (`tape::record` with an `Op` from `backprop`). One file per family.
//! Every op returns a `Result`: shapes, dtypes and devices are checked here, and the
//! allocator's out-of-memory surfaces as `TensorError::OutOfMemory`.
//!
//! Not for: kernels (see `backend`) or derivative rules (see `backprop`).

pub mod attention;
pub mod causal_attention;
pub mod elementwise;
pub mod gelu_linear;
pub mod linear_loss;
pub mod matmul;
pub mod nn;
pub mod reduce;
pub mod rotary;
pub mod swiglu;
pub mod tensor_parallel;
pub mod view;

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;

/// An uninitialised tensor of `x`'s shape, dtype and device (an op's output).
pub(crate) fn out_like(x: &Tensor, name: &str) -> Result<Tensor> {
    Tensor::empty(&x.device(), x.shape(), x.dtype(), name)
}

pub(crate) fn same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(TensorError::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    if !a.device().same(&b.device()) {
        return Err(TensorError::DeviceMismatch { op });
    }
    Ok(())
}

pub(crate) fn float_only(op: &'static str, t: &Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        return Err(TensorError::UnsupportedDType {
            op,
            dtype: t.dtype(),
        });
    }
    Ok(())
}

pub(crate) fn index_dtype(op: &'static str, t: &Tensor) -> Result<()> {
    if !matches!(t.dtype(), DType::I32 | DType::I64) {
        return Err(TensorError::UnsupportedDType {
            op,
            dtype: t.dtype(),
        });
    }
    Ok(())
}

/// Copies `src` into the (possibly strided) view `dst` of the same shape, converting dtype.
pub(crate) fn copy_into(src: &Tensor, dst: &Tensor) -> Result<()> {
    if src.shape() != dst.shape() {
        return Err(TensorError::ShapeMismatch {
            op: "copy",
            lhs: src.shape().to_vec(),
            rhs: dst.shape().to_vec(),
        });
    }
    if src.same_storage(dst) {
        let staged = src.contiguous_copy()?;
        return src.backend().copy(&staged.src(), &mut dst.dst());
    }
    src.backend().copy(&src.src(), &mut dst.dst())
}

impl Tensor {
    /// `self += other` in place (no autodiff): gradient accumulation and optimizer updates.
    pub fn add_assign(&self, other: &Tensor) -> Result<()> {
        same_dtype("add_assign", self, other)?;
        if self.shape() != other.shape() {
            return Err(TensorError::ShapeMismatch {
                op: "add_assign",
                lhs: self.shape().to_vec(),
                rhs: other.shape().to_vec(),
            });
        }
        if self.same_storage(other) {
            let staged = other.contiguous_copy()?;
            return self.backend().add_assign(&mut self.dst(), &staged.src());
        }
        self.backend().add_assign(&mut self.dst(), &other.src())
    }

    /// Sets every element (through this view) to `value`, in place (no autodiff).
    pub fn fill_(&self, value: f32) -> Result<()> {
        self.backend().fill(&mut self.dst(), value)
    }

    /// An untracked contiguous copy in the current output category.
    pub(crate) fn contiguous_copy(&self) -> Result<Tensor> {
        let out = Tensor::empty(&self.device(), self.shape(), self.dtype(), "contiguous")?;
        self.backend().copy(&self.src(), &mut out.dst())?;
        Ok(out)
    }
}
