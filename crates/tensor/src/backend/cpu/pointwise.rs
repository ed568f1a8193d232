//! The elementwise ops on the CPU: the dtype dispatch of `Backend::add_assign`, `unary`,
//! `binary` and `gelu_backward_with_output` onto `elementwise`'s loops, one monomorphised loop
//! per op.
//!
//! Not for: the loops themselves (see `elementwise`) or the scalar math (see `math`).

use super::buffers::{rows_of, slice, slice_mut, unsupported};
use super::{elementwise, math};
use crate::backend::{BinaryOp, Dst, Src, UnaryOp};
use crate::dtype::{Elem, with_float_type};
use crate::error::Result;

pub(super) fn add_assign(dst: &mut Dst, src: &Src) -> Result<()> {
    let lo = dst.layout.clone();
    with_float_type!(dst.dtype, T => {
        elementwise::update(slice_mut::<T>(dst)?, &lo, slice::<T>(src)?, src.layout, |o, x| o + x);
        Ok(())
    }, _ => Err(unsupported("add_assign", dst.dtype)))
}

pub(super) fn unary(op: UnaryOp, x: &Src, dst: &mut Dst) -> Result<()> {
    with_float_type!(x.dtype, T => {
        let xs = slice::<T>(x)?;
        let out = slice_mut::<T>(dst)?;
        // One monomorphised loop per op: each arm's closure names its op as a constant, so
        // the op's `match` folds away inside the element loop and the loop can vectorise.
        macro_rules! go {
            ($($variant:ident),*) => {
                match op {
                    $(UnaryOp::$variant => elementwise::map1(xs, x.layout, out, |v| math::unary(UnaryOp::$variant, v)),)*
                    UnaryOp::Affine { mul, add } => elementwise::map1(xs, x.layout, out, move |v| v * mul + add),
                    UnaryOp::Powf(p) => elementwise::map1(xs, x.layout, out, move |v| math::unary(UnaryOp::Powf(p), v)),
                }
            };
        }
        go!(Neg, Exp, Log, Sqrt, Tanh, Sigmoid, Relu, Gelu, Silu);
        Ok(())
    }, _ => Err(unsupported("unary", x.dtype)))
}

pub(super) fn binary(op: BinaryOp, a: &Src, b: &Src, dst: &mut Dst) -> Result<()> {
    with_float_type!(a.dtype, T => {
        let (xa, xb) = (slice::<T>(a)?, slice::<T>(b)?);
        let out = slice_mut::<T>(dst)?;
        let (la, lb) = (a.layout, b.layout);
        match op {
            BinaryOp::Add => elementwise::map2(xa, la, xb, lb, out, |p, q| p + q),
            BinaryOp::Sub => elementwise::map2(xa, la, xb, lb, out, |p, q| p - q),
            BinaryOp::Mul => elementwise::map2(xa, la, xb, lb, out, |p, q| p * q),
            BinaryOp::Div => elementwise::map2(xa, la, xb, lb, out, |p, q| p / q),
            BinaryOp::Eq => elementwise::map2(xa, la, xb, lb, out, |p, q| if p == q { 1.0 } else { 0.0 }),
            BinaryOp::SiluMul => elementwise::map2(xa, la, xb, lb, out, |p, q| {
                T::from_f32(math::unary(UnaryOp::Silu, p)).to_f32() * q
            }),
            BinaryOp::UnaryGrad(u) => {
                // As in `unary`: a constant op per arm, so the derivative's match folds away.
                macro_rules! grad {
                    ($($variant:ident),*) => {
                        match u {
                            $(UnaryOp::$variant => elementwise::map2(xa, la, xb, lb, out, |s, g| math::unary_grad(UnaryOp::$variant, s, g)),)*
                            UnaryOp::Affine { mul, .. } => elementwise::map2(xa, la, xb, lb, out, move |_, g| g * mul),
                            UnaryOp::Powf(p) => elementwise::map2(xa, la, xb, lb, out, move |s, g| math::unary_grad(UnaryOp::Powf(p), s, g)),
                        }
                    };
                }
                grad!(Neg, Exp, Log, Sqrt, Tanh, Sigmoid, Relu, Gelu, Silu)
            }
        }
        Ok(())
    }, _ => Err(unsupported("binary", a.dtype)))
}

pub(super) fn gelu_backward_with_output(x: &Src, grad: &mut Dst, y: &mut Dst) -> Result<()> {
    with_float_type!(x.dtype, T => {
        elementwise::gelu_grad_and_value(
            rows_of::<T>(x)?, slice_mut::<T>(grad)?, slice_mut::<T>(y)?,
        );
        Ok(())
    }, _ => Err(unsupported("gelu_backward", x.dtype)))
}
