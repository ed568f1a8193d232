//! Element-wise CPU kernels over arbitrary layouts: unary and binary maps (broadcasting is a
//! stride-0 layout made by the ops layer), strided copies with dtype conversion, fills and the
//! in-place accumulation used for gradients. Outputs are split into fixed chunks of rows for
//! rayon; every element is computed by the same code whatever the thread count, so results are
//! deterministic.
//!
//! Not for: reductions across elements (see `reduce`).

use crate::dtype::Elem;
use crate::shape::Layout;
use rayon::prelude::*;

/// Elements per parallel task; smaller outputs run on the calling thread.
const CHUNK: usize = 1 << 14;

fn inner_dim(layout: &Layout) -> (usize, usize) {
    match (layout.shape().last(), layout.strides().last()) {
        (Some(&d), Some(&s)) => (d, s),
        _ => (1, 0),
    }
}

/// Calls `visit(row_start_offset, inner_stride, out_row)` for each row of a contiguous output,
/// in parallel chunks of whole rows.
fn for_rows<U: Send>(out: &mut [U], inner: usize, visit: impl Fn(usize, &mut [U]) + Sync) {
    if out.is_empty() || inner == 0 {
        return;
    }
    let rows_per_chunk = (CHUNK / inner).max(1);
    let run = |(c, chunk): (usize, &mut [U])| {
        for (r, row) in chunk.chunks_mut(inner).enumerate() {
            visit(c * rows_per_chunk + r, row);
        }
    };
    if out.len() <= CHUNK {
        run((0, out));
    } else {
        out.par_chunks_mut(rows_per_chunk * inner)
            .enumerate()
            .for_each(run);
    }
}

/// `out[i] = f(x[i])` for a contiguous `out` and any layout of `x` with the same shape.
pub fn map1<T: Elem, U: Elem>(x: &[T], lx: &Layout, out: &mut [U], f: impl Fn(f32) -> f32 + Sync) {
    let (inner, sx) = inner_dim(lx);
    if lx.is_contiguous() {
        let x = &x[lx.offset()..lx.offset() + out.len()];
        for_rows(out, inner, |r, row| {
            let xr = &x[r * inner..(r + 1) * inner];
            for (o, &v) in row.iter_mut().zip(xr) {
                *o = U::from_f32(f(v.to_f32()));
            }
        });
        return;
    }
    for_rows(out, inner, |r, row| {
        let base = lx.index_of(r * inner);
        for (j, o) in row.iter_mut().enumerate() {
            *o = U::from_f32(f(x[base + j * sx].to_f32()));
        }
    });
}

/// `out[i] = f(a[i], b[i])` for a contiguous `out` and any same-shaped layouts of `a` and `b`.
pub fn map2<T: Elem>(
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    out: &mut [T],
    f: impl Fn(f32, f32) -> f32 + Sync,
) {
    let (inner, sa) = inner_dim(la);
    let (_, sb) = inner_dim(lb);
    if la.is_contiguous() && lb.is_contiguous() {
        let n = out.len();
        let a = &a[la.offset()..la.offset() + n];
        let b = &b[lb.offset()..lb.offset() + n];
        for_rows(out, inner, |r, row| {
            let range = r * inner..(r + 1) * inner;
            for ((o, &x), &y) in row.iter_mut().zip(&a[range.clone()]).zip(&b[range]) {
                *o = T::from_f32(f(x.to_f32(), y.to_f32()));
            }
        });
        return;
    }
    for_rows(out, inner, |r, row| {
        let (ba, bb) = (la.index_of(r * inner), lb.index_of(r * inner));
        for (j, o) in row.iter_mut().enumerate() {
            *o = T::from_f32(f(a[ba + j * sa].to_f32(), b[bb + j * sb].to_f32()));
        }
    });
}

/// Sequential strided copy of any plain-old-data element type into a strided destination.
pub fn copy_strided<T: Copy, U>(
    x: &[T],
    lx: &Layout,
    out: &mut [U],
    lo: &Layout,
    convert: impl Fn(T) -> U,
) {
    let (inner, sx) = inner_dim(lx);
    let (_, so) = inner_dim(lo);
    if inner == 0 {
        return;
    }
    for r in 0..lx.numel() / inner {
        let (bx, bo) = (lx.index_of(r * inner), lo.index_of(r * inner));
        for j in 0..inner {
            out[bo + j * so] = convert(x[bx + j * sx]);
        }
    }
}

/// `out[i] = f(out[i], x[i])` over a possibly strided `out`.
pub fn update<T: Elem>(
    out: &mut [T],
    lo: &Layout,
    x: &[T],
    lx: &Layout,
    f: impl Fn(f32, f32) -> f32 + Sync,
) {
    if lo.is_contiguous() {
        let n = lo.numel();
        let (inner, sx) = inner_dim(lx);
        let dst = &mut out[lo.offset()..lo.offset() + n];
        for_rows(dst, inner, |r, row| {
            let bx = lx.index_of(r * inner);
            for (j, o) in row.iter_mut().enumerate() {
                *o = T::from_f32(f(o.to_f32(), x[bx + j * sx].to_f32()));
            }
        });
        return;
    }
    for i in 0..lo.numel() {
        let o = &mut out[lo.index_of(i)];
        *o = T::from_f32(f(o.to_f32(), x[lx.index_of(i)].to_f32()));
    }
}
