//! Reductions: sum, mean and max over a set of axes (with or without kept dims), and
//! `sum_to`, which folds a broadcast gradient back to an input's shape. Sums accumulate in
//! f32 in a fixed order.
//!
//! Not for: row-wise fused reductions such as softmax (see `nn`).

use crate::backend::ReduceOp;
use crate::backprop::Op;
use crate::error::{Result, TensorError};
use crate::ops::float_only;
use crate::shape::{numel, resolve_axis};
use crate::tape::{record, will_record};
use crate::tensor::Tensor;

impl Tensor {
    fn resolve_axes(&self, op: &'static str, axes: &[isize]) -> Result<Vec<usize>> {
        let mut out = axes
            .iter()
            .map(|&a| resolve_axis(op, a, self.rank()))
            .collect::<Result<Vec<_>>>()?;
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    fn reduce_raw(&self, op: ReduceOp, axes: &[usize]) -> Result<Tensor> {
        float_only("reduce", self)?;
        let mut shape = self.shape().to_vec();
        for &a in axes {
            if op == ReduceOp::Max && shape[a] == 0 {
                return Err(TensorError::invalid(
                    "max",
                    format!("axis {a} of shape {:?} is empty", self.shape()),
                ));
            }
            shape[a] = 1;
        }
        let out = Tensor::empty(&self.device(), &shape, self.dtype(), "reduce")?;
        self.backend()
            .reduce(op, &self.src(), axes, &mut out.dst())?;
        Ok(out)
    }

    pub(crate) fn sum_keepdim_axes(&self, axes: &[usize]) -> Result<Tensor> {
        let out = self.reduce_raw(ReduceOp::Sum, axes)?;
        Ok(record(out, &[self], || Op::Sum {
            in_shape: self.shape().to_vec(),
        }))
    }

    /// Sum over `axes` keeping them as size-1 dims.
    pub fn sum_keepdim(&self, axes: &[isize]) -> Result<Tensor> {
        let axes = self.resolve_axes("sum", axes)?;
        self.sum_keepdim_axes(&axes)
    }

    /// Sum over `axes`, removing them.
    pub fn sum(&self, axes: &[isize]) -> Result<Tensor> {
        let resolved = self.resolve_axes("sum", axes)?;
        let kept = self.sum_keepdim_axes(&resolved)?;
        kept.reshape(&drop_axes(self.shape(), &resolved))
    }

    /// Sum of all elements, shape `[]`.
    pub fn sum_all(&self) -> Result<Tensor> {
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.sum(&all)
    }

    pub fn mean_keepdim(&self, axes: &[isize]) -> Result<Tensor> {
        let resolved = self.resolve_axes("mean", axes)?;
        let count: usize = resolved.iter().map(|&a| self.shape()[a]).product();
        self.sum_keepdim_axes(&resolved)?
            .scale(1.0 / count.max(1) as f32)
    }

    pub fn mean(&self, axes: &[isize]) -> Result<Tensor> {
        let resolved = self.resolve_axes("mean", axes)?;
        self.mean_keepdim(axes)?
            .reshape(&drop_axes(self.shape(), &resolved))
    }

    /// Mean of all elements, shape `[]`.
    pub fn mean_all(&self) -> Result<Tensor> {
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.mean(&all)
    }

    /// Max over `axes` keeping them; ties share the gradient equally.
    pub fn max_keepdim(&self, axes: &[isize]) -> Result<Tensor> {
        let axes = self.resolve_axes("max", axes)?;
        let out = self.reduce_raw(ReduceOp::Max, &axes)?;
        let saved = will_record(&[self]).then(|| out.detach());
        Ok(record(out, &[self], || Op::Max {
            x: self.clone(),
            y: saved.unwrap_or_else(|| self.clone()),
            axes,
        }))
    }

    pub fn max(&self, axes: &[isize]) -> Result<Tensor> {
        let resolved = self.resolve_axes("max", axes)?;
        self.max_keepdim(axes)?
            .reshape(&drop_axes(self.shape(), &resolved))
    }

    /// Sums a broadcast result back to `shape` (the inverse of broadcasting to this shape).
    pub fn sum_to(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        if shape.len() > self.rank() || numel(shape) == 0 && self.numel() != 0 {
            return Err(TensorError::ShapeMismatch {
                op: "sum_to",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
            });
        }
        let lead = self.rank() - shape.len();
        let mut axes: Vec<usize> = (0..lead).collect();
        for (i, &d) in shape.iter().enumerate() {
            if d != self.shape()[lead + i] {
                if d != 1 {
                    return Err(TensorError::ShapeMismatch {
                        op: "sum_to",
                        lhs: self.shape().to_vec(),
                        rhs: shape.to_vec(),
                    });
                }
                axes.push(lead + i);
            }
        }
        self.sum_keepdim_axes(&axes)?.reshape(shape)
    }
}

fn drop_axes(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .collect()
}
