//! The CPU backend: kernels over host memory handed out by the device allocator, parallel with
//! rayon, deterministic for a given thread count. This file implements `Backend` and dispatches
//! on dtype (fills, copies and transfers in `transfer`, the elementwise ops in `pointwise`,
//! buffers unpacked by `buffers`); the kernels live in one file per family.
//!
//! Not for: allocation of outputs (the ops layer does that) or autodiff.

pub(crate) mod attention;
mod attention_tile;
pub mod bf16_gemm;
mod buffers;
mod causal_softmax;
mod elementwise;
pub use elementwise::convert_slice;
mod index;
pub mod math;
pub(crate) mod matmul;
pub(crate) mod matmul_causal;
mod pointwise;
mod reduce;
mod rotary;
mod row_sums;
mod rows;
mod simd;
mod transfer;
mod walk;

pub use buffers::{Scratch, scratch_f32};

use super::{AttentionSpec, Backend, BinaryOp, CausalProduct, Dst, ReduceOp, Src, UnaryOp};
use crate::dtype::{DType, with_float_type};
use crate::error::Result;
use buffers::{ids, last_dim, last_two, rows_of, slice, slice_mut, unsupported};

#[derive(Debug)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn fill(&self, dst: &mut Dst, value: f32) -> Result<()> {
        transfer::fill(dst, value)
    }

    fn copy(&self, src: &Src, dst: &mut Dst) -> Result<()> {
        transfer::copy(src, dst)
    }

    fn add_assign(&self, dst: &mut Dst, src: &Src) -> Result<()> {
        pointwise::add_assign(dst, src)
    }

    fn upload_f32(&self, data: &[f32], dst: &mut Dst) -> Result<()> {
        transfer::upload_f32(data, dst)
    }

    fn upload_i64(&self, data: &[i64], dst: &mut Dst) -> Result<()> {
        transfer::upload_i64(data, dst)
    }

    fn download_f32(&self, src: &Src) -> Result<Vec<f32>> {
        transfer::download_f32(src)
    }

    fn download_i64(&self, src: &Src) -> Result<Vec<i64>> {
        transfer::download_i64(src)
    }

    fn unary(&self, op: UnaryOp, x: &Src, dst: &mut Dst) -> Result<()> {
        pointwise::unary(op, x, dst)
    }

    fn binary(&self, op: BinaryOp, a: &Src, b: &Src, dst: &mut Dst) -> Result<()> {
        pointwise::binary(op, a, b, dst)
    }

    fn gelu_backward_with_output(&self, x: &Src, grad: &mut Dst, y: &mut Dst) -> Result<()> {
        pointwise::gelu_backward_with_output(x, grad, y)
    }

    fn reduce(&self, op: ReduceOp, x: &Src, axes: &[usize], dst: &mut Dst) -> Result<()> {
        with_float_type!(x.dtype, T => {
            reduce::reduce(slice::<T>(x)?, x.layout, axes, op, slice_mut::<T>(dst)?);
            Ok(())
        }, _ => Err(unsupported("reduce", x.dtype)))
    }

    fn matmul_bias(&self, a: &Src, b: &Src, bias: &Src, dst: &mut Dst) -> Result<()> {
        matmul::matmul_bias(self, a, b, bias, dst)
    }

    fn matmul(&self, a: &Src, b: &Src, dst: &mut Dst) -> Result<()> {
        let d = matmul::Dims::of(a, dst);
        if d.m * d.n == 0 {
            return Ok(());
        }
        if d.k == 0 {
            return self.fill(dst, 0.0);
        }
        let device = dst.buf.device().clone();
        match a.dtype {
            DType::F32 => matmul::matmul_f32(
                slice::<f32>(a)?,
                a.layout,
                slice::<f32>(b)?,
                b.layout,
                slice_mut(dst)?,
                d,
            ),
            DType::F16 => matmul::matmul_widening::<half::f16>(
                &device,
                slice(a)?,
                a.layout,
                slice(b)?,
                b.layout,
                slice_mut(dst)?,
                d,
            )?,
            DType::BF16 => matmul::matmul_bf16(
                &device,
                slice(a)?,
                a.layout,
                slice(b)?,
                b.layout,
                slice_mut(dst)?,
                d,
            )?,
            other => return Err(unsupported("matmul", other)),
        }
        Ok(())
    }

    fn matmul_causal(&self, a: &Src, b: &Src, dst: &mut Dst, kind: CausalProduct) -> Result<()> {
        let d = matmul::Dims::of(a, dst);
        if !matmul_causal::causal_fits(a.dtype, &d, kind) {
            return self.matmul(a, b, dst);
        }
        matmul_causal::matmul_f32_causal(
            slice::<f32>(a)?,
            a.layout,
            slice::<f32>(b)?,
            b.layout,
            slice_mut(dst)?,
            d,
            kind,
        );
        Ok(())
    }

    fn softmax(&self, x: &Src, log: bool, dst: &mut Dst) -> Result<()> {
        with_float_type!(x.dtype, T => {
            rows::softmax(rows_of::<T>(x)?, last_dim(x), log, slice_mut::<T>(dst)?);
            Ok(())
        }, _ => Err(unsupported("softmax", x.dtype)))
    }

    fn softmax_backward(&self, y: &Src, dy: &Src, log: bool, dst: &mut Dst) -> Result<()> {
        with_float_type!(y.dtype, T => {
            rows::softmax_backward(rows_of::<T>(y)?, rows_of::<T>(dy)?, last_dim(y), log, slice_mut::<T>(dst)?);
            Ok(())
        }, _ => Err(unsupported("softmax_backward", y.dtype)))
    }

    fn causal_softmax(
        &self,
        x: &Src,
        scale: f32,
        window: Option<usize>,
        dst: &mut Dst,
    ) -> Result<()> {
        let (tq, tk) = last_two(x);
        let mask = causal_softmax::Mask { tq, tk, window };
        with_float_type!(x.dtype, T => {
            causal_softmax::causal_softmax(rows_of::<T>(x)?, mask, scale, slice_mut::<T>(dst)?);
            Ok(())
        }, _ => Err(unsupported("causal_softmax", x.dtype)))
    }

    fn causal_softmax_backward(
        &self,
        y: &Src,
        dy: &Src,
        scale: f32,
        window: Option<usize>,
        dst: &mut Dst,
    ) -> Result<()> {
        let (tq, tk) = last_two(y);
        let mask = causal_softmax::Mask { tq, tk, window };
        with_float_type!(y.dtype, T => {
            causal_softmax::causal_softmax_backward(
                rows_of::<T>(y)?, rows_of::<T>(dy)?, mask, scale, slice_mut::<T>(dst)?,
            );
            Ok(())
        }, _ => Err(unsupported("causal_softmax_backward", y.dtype)))
    }

    fn layer_norm(
        &self,
        x: &Src,
        w: &Src,
        b: &Src,
        eps: f32,
        y: &mut Dst,
        mean: &mut Dst,
        rstd: &mut Dst,
    ) -> Result<()> {
        with_float_type!(x.dtype, T => {
            rows::layer_norm(rows_of::<T>(x)?, rows_of::<T>(w)?, rows_of::<T>(b)?, last_dim(x), eps,
                slice_mut::<T>(y)?, slice_mut::<f32>(mean)?, slice_mut::<f32>(rstd)?);
            Ok(())
        }, _ => Err(unsupported("layer_norm", x.dtype)))
    }

    fn layer_norm_backward(
        &self,
        x: &Src,
        w: &Src,
        mean: &Src,
        rstd: &Src,
        dy: &Src,
        dx: &mut Dst,
        dw: &mut Dst,
        db: &mut Dst,
    ) -> Result<()> {
        let c = last_dim(x);
        let mut acc = scratch_f32(&dx.buf.device().clone(), 2 * c, "layer_norm.dw_db")?;
        with_float_type!(x.dtype, T => {
            rows::layer_norm_backward(rows_of::<T>(x)?, rows_of::<T>(w)?, rows_of::<f32>(mean)?, rows_of::<f32>(rstd)?,
                rows_of::<T>(dy)?, c, slice_mut::<T>(dx)?, slice_mut::<T>(dw)?, slice_mut::<T>(db)?, acc.slice_mut());
            Ok(())
        }, _ => Err(unsupported("layer_norm_backward", x.dtype)))
    }

    fn rms_norm(&self, x: &Src, w: &Src, eps: f32, y: &mut Dst, rstd: &mut Dst) -> Result<()> {
        with_float_type!(x.dtype, T => {
            rows::rms_norm(rows_of::<T>(x)?, rows_of::<T>(w)?, last_dim(x), eps, slice_mut::<T>(y)?, slice_mut::<f32>(rstd)?);
            Ok(())
        }, _ => Err(unsupported("rms_norm", x.dtype)))
    }

    fn rms_norm_backward(
        &self,
        x: &Src,
        w: &Src,
        rstd: &Src,
        dy: &Src,
        dx: &mut Dst,
        dw: &mut Dst,
    ) -> Result<()> {
        let c = last_dim(x);
        let mut acc = scratch_f32(&dx.buf.device().clone(), c, "rms_norm.dw")?;
        with_float_type!(x.dtype, T => {
            rows::rms_norm_backward(rows_of::<T>(x)?, rows_of::<T>(w)?, rows_of::<f32>(rstd)?, rows_of::<T>(dy)?, c,
                slice_mut::<T>(dx)?, slice_mut::<T>(dw)?, acc.slice_mut());
            Ok(())
        }, _ => Err(unsupported("rms_norm_backward", x.dtype)))
    }

    fn rope(&self, x: &Src, cos: &Src, sin: &Src, inverse: bool, dst: &mut Dst) -> Result<()> {
        let shape = x.layout.shape();
        let r = shape.len();
        let (t, h, d) = (shape[r - 3], shape[r - 2], shape[r - 1]);
        let (cos, sin) = (rows_of::<f32>(cos)?, rows_of::<f32>(sin)?);
        with_float_type!(x.dtype, T => {
            rotary::rope(rows_of::<T>(x)?, cos, sin, t, h, d, inverse, slice_mut::<T>(dst)?);
            Ok(())
        }, _ => Err(unsupported("rope", x.dtype)))
    }

    fn embedding(&self, table: &Src, ids_src: &Src, dst: &mut Dst) -> Result<()> {
        let (v, c) = (table.layout.shape()[0], last_dim(table));
        let ids = ids(ids_src)?;
        with_float_type!(table.dtype, T => index::embedding(rows_of::<T>(table)?, v, &ids, c, slice_mut::<T>(dst)?),
            _ => Err(unsupported("embedding", table.dtype)))
    }

    fn embedding_backward(&self, ids_src: &Src, dy: &Src, dtable: &mut Dst) -> Result<()> {
        let c = last_dim(dy);
        let ids = ids(ids_src)?;
        let mut acc = scratch_f32(
            &dtable.buf.device().clone(),
            dtable.layout.numel(),
            "embedding.scatter_add",
        )?;
        with_float_type!(dy.dtype, T => index::embedding_backward(&ids, rows_of::<T>(dy)?, c, acc.slice_mut(), slice_mut::<T>(dtable)?),
            _ => Err(unsupported("embedding_backward", dy.dtype)))
    }

    fn gather_last(&self, x: &Src, idx: &Src, dst: &mut Dst) -> Result<()> {
        let ids = ids(idx)?;
        with_float_type!(x.dtype, T => index::gather_last(rows_of::<T>(x)?, last_dim(x), &ids, slice_mut::<T>(dst)?),
            _ => Err(unsupported("gather", x.dtype)))
    }

    fn scatter_last(&self, idx: &Src, dy: &Src, dst: &mut Dst) -> Result<()> {
        let ids = ids(idx)?;
        let v = dst.layout.shape().last().copied().unwrap_or(1);
        with_float_type!(dy.dtype, T => index::scatter_last(&ids, rows_of::<T>(dy)?, v, slice_mut::<T>(dst)?),
            _ => Err(unsupported("scatter", dy.dtype)))
    }

    fn dropout(&self, x: &Src, p: f32, seed: u64, offset: u64, dst: &mut Dst) -> Result<()> {
        with_float_type!(x.dtype, T => {
            index::dropout(rows_of::<T>(x)?, p, seed, offset, slice_mut::<T>(dst)?);
            Ok(())
        }, _ => Err(unsupported("dropout", x.dtype)))
    }

    fn causal_mask(&self, x: &Src, fill: f32, dst: &mut Dst) -> Result<()> {
        let s = x.layout.shape();
        let (rows, cols) = (s[s.len() - 2], s[s.len() - 1]);
        with_float_type!(x.dtype, T => {
            index::causal_mask(rows_of::<T>(x)?, rows, cols, fill, slice_mut::<T>(dst)?);
            Ok(())
        }, _ => Err(unsupported("causal_mask", x.dtype)))
    }

    fn attention(
        &self,
        q: &Src,
        k: &Src,
        v: &Src,
        spec: &AttentionSpec,
        o: &mut Dst,
        lse: &mut Dst,
    ) -> Result<()> {
        attention::forward(q, k, v, spec, o, lse)
    }

    fn attention_backward(
        &self,
        saved: [&Src; 5],
        d_o: &Src,
        spec: &AttentionSpec,
        dq: Option<&mut Dst>,
        dk: Option<&mut Dst>,
        dv: Option<&mut Dst>,
    ) -> Result<()> {
        attention::backward(saved, d_o, spec, dq, dk, dv)
    }
}

/// `n` test inputs uniform in [−1, 1), drawn from the engine's counter-based generator.
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| 2.0 * crate::rng::uniform(seed, i as u64) - 1.0)
        .collect()
}
