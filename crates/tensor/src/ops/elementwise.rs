//! Element-wise ops: add, sub, mul, div with NumPy broadcasting, scalar affine maps, and the
//! activation functions. Broadcasting is done with stride-0 views, never copies.
//!
//! Not for: reductions (see `reduce`).

use crate::autocast;
use crate::backend::{BinaryOp, UnaryOp};
use crate::backprop::Op;
use crate::error::Result;
use crate::ops::{float_only, same_dtype};
use crate::shape::broadcast_shapes;
use crate::tape::{record, will_record};
use crate::tensor::Tensor;

impl Tensor {
    /// Runs a binary kernel after broadcasting both sides (not recorded).
    pub(crate) fn binary_raw(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        same_dtype("binary", self, other)?;
        float_only("binary", self)?;
        let shape = broadcast_shapes("binary", self.shape(), other.shape())?;
        let a = self.with_layout(self.layout().broadcast_to(&shape)?);
        let b = other.with_layout(other.layout().broadcast_to(&shape)?);
        let out = Tensor::empty(&self.device(), &shape, self.dtype(), "binary")?;
        self.backend()
            .binary(op, &a.src(), &b.src(), &mut out.dst())?;
        Ok(out)
    }

    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        if let Some((a, b)) = autocast::promote_pair(self, other)? {
            return a.add(&b);
        }
        let out = self.binary_raw(BinaryOp::Add, other)?;
        Ok(record(out, &[self, other], || Op::Add {
            a_shape: self.shape().to_vec(),
            b_shape: other.shape().to_vec(),
        }))
    }

    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        if let Some((a, b)) = autocast::promote_pair(self, other)? {
            return a.sub(&b);
        }
        let out = self.binary_raw(BinaryOp::Sub, other)?;
        Ok(record(out, &[self, other], || Op::Sub {
            a_shape: self.shape().to_vec(),
            b_shape: other.shape().to_vec(),
        }))
    }

    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        if let Some((a, b)) = autocast::promote_pair(self, other)? {
            return a.mul(&b);
        }
        let out = self.binary_raw(BinaryOp::Mul, other)?;
        Ok(record(out, &[self, other], || Op::Mul {
            a: other.requires_grad().then(|| self.clone()),
            b: self.requires_grad().then(|| other.clone()),
            a_shape: self.shape().to_vec(),
            b_shape: other.shape().to_vec(),
        }))
    }

    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        if let Some((a, b)) = autocast::promote_pair(self, other)? {
            return a.div(&b);
        }
        let out = self.binary_raw(BinaryOp::Div, other)?;
        Ok(record(out, &[self, other], || Op::Div {
            a: other.requires_grad().then(|| self.clone()),
            b: other.clone(),
            a_shape: self.shape().to_vec(),
            b_shape: other.shape().to_vec(),
        }))
    }

    /// 1.0 where equal, else 0.0 (not differentiable; never recorded).
    pub fn eq_mask(&self, other: &Tensor) -> Result<Tensor> {
        self.binary_raw(BinaryOp::Eq, other)
    }

    /// Runs a unary kernel (not recorded).
    pub(crate) fn unary_raw(&self, op: UnaryOp) -> Result<Tensor> {
        float_only("unary", self)?;
        let out = Tensor::empty(&self.device(), self.shape(), self.dtype(), "unary")?;
        self.backend().unary(op, &self.src(), &mut out.dst())?;
        Ok(out)
    }

    fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        let out = self.unary_raw(op)?;
        let saved = if !will_record(&[self]) || !op.grad_needs_saved() {
            None
        } else if op.grad_from_output() {
            Some(out.detach())
        } else {
            Some(self.clone())
        };
        Ok(record(out, &[self], || Op::Unary { op, saved }))
    }

    /// `self * mul + add`.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Affine { mul, add })
    }

    pub fn scale(&self, s: f32) -> Result<Tensor> {
        self.affine(s, 0.0)
    }

    pub fn add_scalar(&self, s: f32) -> Result<Tensor> {
        self.affine(1.0, s)
    }

    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }

    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }

    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log)
    }

    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }

    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }

    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }

    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }

    /// GELU, tanh approximation.
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu)
    }

    pub fn silu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Silu)
    }

    pub fn powf(&self, p: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Powf(p))
    }
}
