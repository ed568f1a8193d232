//! The CPU backend: kernels over host memory handed out by the device allocator, parallel with
//! rayon, deterministic for a given thread count. This file dispatches on dtype and unpacks
//! buffers; the kernels live in one file per family.
//!
//! Not for: allocation of outputs (the ops layer does that) or autodiff.

pub(crate) mod attention;
mod attention_tile;
pub mod bf16_gemm;
mod causal_softmax;
mod elementwise;
pub use elementwise::convert_slice;
mod index;
pub mod math;
pub(crate) mod matmul;
mod reduce;
mod rotary;
mod row_sums;
mod rows;
mod simd;
mod walk;

use super::{AttentionSpec, Backend, BinaryOp, Dst, ReduceOp, Src, UnaryOp};
use crate::dtype::{DType, Elem, with_float_type};
use crate::error::{Result, TensorError};
use crate::shape::Layout;
use headroom_memory::{Category, Device, DeviceBuffer};
use index::Ids;

#[derive(Debug)]
pub struct CpuBackend;

/// An f32 scratch buffer from the device allocator, tagged `temporary`.
#[derive(Debug)]
pub struct Scratch(DeviceBuffer);

impl Scratch {
    pub fn slice_mut(&mut self) -> &mut [f32] {
        bytemuck::cast_slice_mut(self.0.as_bytes_mut().unwrap_or(&mut []))
    }
}

pub fn scratch_f32(device: &Device, n: usize, name: &str) -> Result<Scratch> {
    Ok(Scratch(device.alloc(
        (n * 4) as u64,
        Category::Temporary,
        Some(name),
    )?))
}

fn bytes(buf: &DeviceBuffer) -> Result<&[u8]> {
    buf.as_bytes()
        .ok_or(TensorError::ShapeOnly { op: "cpu kernel" })
}

fn slice<'a, T: bytemuck::Pod>(s: &'a Src) -> Result<&'a [T]> {
    Ok(bytemuck::cast_slice(bytes(&s.buf)?))
}

fn slice_mut<'a, T: bytemuck::Pod>(d: &'a mut Dst) -> Result<&'a mut [T]> {
    let b = d
        .buf
        .as_bytes_mut()
        .ok_or(TensorError::ShapeOnly { op: "cpu kernel" })?;
    Ok(bytemuck::cast_slice_mut(b))
}

/// The contiguous elements of a source (from its offset, `numel` long).
fn rows_of<'a, T: bytemuck::Pod>(s: &'a Src) -> Result<&'a [T]> {
    let all = slice::<T>(s)?;
    Ok(&all[s.layout.offset()..s.layout.offset() + s.layout.numel()])
}

fn ids<'a>(s: &'a Src) -> Result<Ids<'a>> {
    let all = |n: usize| s.layout.offset()..s.layout.offset() + n;
    match s.dtype {
        DType::I32 => Ok(Ids::I32(&slice::<i32>(s)?[all(s.layout.numel())])),
        DType::I64 => Ok(Ids::I64(&slice::<i64>(s)?[all(s.layout.numel())])),
        other => Err(TensorError::UnsupportedDType {
            op: "index",
            dtype: other,
        }),
    }
}

fn unsupported(op: &'static str, dtype: DType) -> TensorError {
    TensorError::UnsupportedDType { op, dtype }
}

/// The last two axes (rows, columns) of a rank ≥ 2 source.
fn last_two(s: &Src) -> (usize, usize) {
    let shape = s.layout.shape();
    (shape[shape.len() - 2], shape[shape.len() - 1])
}

fn last_dim(s: &Src) -> usize {
    s.layout.shape().last().copied().unwrap_or(1)
}

impl CpuBackend {
    fn copy_float<T: Elem>(&self, src: &Src, dst: &mut Dst) -> Result<()> {
        let x = slice::<T>(src)?;
        let lo = dst.layout.clone();
        if src.dtype == dst.dtype && lo.is_contiguous() {
            // Same dtype: the bits move unchanged (no round trip through f32), as
            // PyTorch's `copy_` moves them.
            let out = &mut slice_mut::<T>(dst)?[lo.offset()..lo.offset() + lo.numel()];
            elementwise::gather(x, src.layout, out);
            return Ok(());
        }
        with_float_type!(dst.dtype, U => {
            let out = slice_mut::<U>(dst)?;
            if lo.is_contiguous() {
                let n = lo.numel();
                elementwise::map1(x, src.layout, &mut out[lo.offset()..lo.offset() + n], |v| v);
            } else {
                elementwise::copy_strided(x, src.layout, out, &lo, |v: T| U::from_f32(v.to_f32()));
            }
            Ok(())
        }, _ => Err(TensorError::DTypeMismatch { op: "copy", lhs: src.dtype, rhs: dst.dtype }))
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn fill(&self, dst: &mut Dst, value: f32) -> Result<()> {
        let l = dst.layout.clone();
        match dst.dtype {
            DType::I32 => {
                elementwise::copy_strided(&[value as i32], &splat(&l), slice_mut(dst)?, &l, |v| v)
            }
            DType::I64 => {
                elementwise::copy_strided(&[value as i64], &splat(&l), slice_mut(dst)?, &l, |v| v)
            }
            dt => with_float_type!(dt, T => {
                elementwise::copy_strided(&[T::from_f32(value)], &splat(&l), slice_mut::<T>(dst)?, &l, |v| v)
            }, _ => unreachable!("int dtypes handled above")),
        }
        Ok(())
    }

    fn copy(&self, src: &Src, dst: &mut Dst) -> Result<()> {
        match (src.dtype, dst.dtype) {
            (DType::I32, DType::I32) => {
                let l = dst.layout.clone();
                elementwise::copy_strided(
                    slice::<i32>(src)?,
                    src.layout,
                    slice_mut::<i32>(dst)?,
                    &l,
                    |v| v,
                );
                Ok(())
            }
            (DType::I64, DType::I64) => {
                let l = dst.layout.clone();
                elementwise::copy_strided(
                    slice::<i64>(src)?,
                    src.layout,
                    slice_mut::<i64>(dst)?,
                    &l,
                    |v| v,
                );
                Ok(())
            }
            (s, _) => with_float_type!(s, T => self.copy_float::<T>(src, dst),
                _ => Err(TensorError::DTypeMismatch { op: "copy", lhs: src.dtype, rhs: dst.dtype })),
        }
    }

    fn add_assign(&self, dst: &mut Dst, src: &Src) -> Result<()> {
        let lo = dst.layout.clone();
        with_float_type!(dst.dtype, T => {
            elementwise::update(slice_mut::<T>(dst)?, &lo, slice::<T>(src)?, src.layout, |o, x| o + x);
            Ok(())
        }, _ => Err(unsupported("add_assign", dst.dtype)))
    }

    fn upload_f32(&self, data: &[f32], dst: &mut Dst) -> Result<()> {
        let (l, host) = (dst.layout.clone(), Layout::contiguous(dst.layout.shape()));
        with_float_type!(dst.dtype, T => {
            let out = slice_mut::<T>(dst)?;
            if l.is_contiguous() {
                convert_slice(data, &mut out[l.offset()..l.offset() + l.numel()]);
            } else {
                elementwise::copy_strided(data, &host, out, &l, T::from_f32);
            }
            Ok(())
        }, _ => Err(unsupported("upload_f32", dst.dtype)))
    }

    fn upload_i64(&self, data: &[i64], dst: &mut Dst) -> Result<()> {
        let (l, host) = (dst.layout.clone(), Layout::contiguous(dst.layout.shape()));
        match dst.dtype {
            DType::I64 => elementwise::copy_strided(data, &host, slice_mut::<i64>(dst)?, &l, |v| v),
            DType::I32 => {
                if let Some(&bad) = data.iter().find(|&&v| i32::try_from(v).is_err()) {
                    return Err(TensorError::IndexOutOfRange {
                        op: "upload",
                        index: bad,
                        size: i32::MAX as usize,
                    });
                }
                elementwise::copy_strided(data, &host, slice_mut::<i32>(dst)?, &l, |v| v as i32)
            }
            other => return Err(unsupported("upload_i64", other)),
        }
        Ok(())
    }

    fn download_f32(&self, src: &Src) -> Result<Vec<f32>> {
        with_float_type!(src.dtype, T => {
            let x = slice::<T>(src)?;
            let l = src.layout;
            if l.is_contiguous() {
                let mut out = vec![0.0f32; l.numel()];
                convert_slice(&x[l.offset()..l.offset() + l.numel()], &mut out);
                return Ok(out);
            }
            Ok((0..l.numel()).map(|i| x[l.index_of(i)].to_f32()).collect())
        }, _ => Err(unsupported("download_f32", src.dtype)))
    }

    fn download_i64(&self, src: &Src) -> Result<Vec<i64>> {
        let l = src.layout;
        match src.dtype {
            DType::I64 => Ok((0..l.numel())
                .map(|i| slice::<i64>(src).map(|x| x[l.index_of(i)]))
                .collect::<Result<_>>()?),
            DType::I32 => {
                let x = slice::<i32>(src)?;
                Ok((0..l.numel()).map(|i| x[l.index_of(i)] as i64).collect())
            }
            other => Err(unsupported("download_i64", other)),
        }
    }

    fn unary(&self, op: UnaryOp, x: &Src, dst: &mut Dst) -> Result<()> {
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

    fn binary(&self, op: BinaryOp, a: &Src, b: &Src, dst: &mut Dst) -> Result<()> {
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

    fn gelu_backward_with_output(&self, x: &Src, grad: &mut Dst, y: &mut Dst) -> Result<()> {
        with_float_type!(x.dtype, T => {
            elementwise::gelu_grad_and_value(
                rows_of::<T>(x)?, slice_mut::<T>(grad)?, slice_mut::<T>(y)?,
            );
            Ok(())
        }, _ => Err(unsupported("gelu_backward", x.dtype)))
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

/// A layout that reads element 0 for every position of `like`.
fn splat(like: &Layout) -> Layout {
    Layout::new(like.shape().to_vec(), vec![0; like.rank()], 0)
}
