//! Fills, copies and host transfers on the CPU: the dtype dispatch of `Backend::fill`, `copy`,
//! `upload_*` and `download_*` onto `elementwise`'s copy loops.
//!
//! Not for: the elementwise ops (see `pointwise`) or the loops themselves (see `elementwise`).

use super::buffers::{slice, slice_mut, unsupported};
use super::elementwise::{self, convert_slice};
use crate::backend::{Dst, Src};
use crate::dtype::{DType, Elem, with_float_type};
use crate::error::{Result, TensorError};
use crate::shape::Layout;

pub(super) fn fill(dst: &mut Dst, value: f32) -> Result<()> {
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

pub(super) fn copy(src: &Src, dst: &mut Dst) -> Result<()> {
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
        (s, _) => with_float_type!(s, T => copy_float::<T>(src, dst),
            _ => Err(TensorError::DTypeMismatch { op: "copy", lhs: src.dtype, rhs: dst.dtype })),
    }
}

fn copy_float<T: Elem>(src: &Src, dst: &mut Dst) -> Result<()> {
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

pub(super) fn upload_f32(data: &[f32], dst: &mut Dst) -> Result<()> {
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

pub(super) fn upload_i64(data: &[i64], dst: &mut Dst) -> Result<()> {
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

pub(super) fn download_f32(src: &Src) -> Result<Vec<f32>> {
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

pub(super) fn download_i64(src: &Src) -> Result<Vec<i64>> {
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

/// A layout that reads element 0 for every position of `like`.
fn splat(like: &Layout) -> Layout {
    Layout::new(like.shape().to_vec(), vec![0; like.rank()], 0)
}
