//! Element-wise CPU kernels over arbitrary layouts: unary and binary maps (broadcasting is a
//! stride-0 layout made by the ops layer), strided copies with dtype conversion, fills and the
//! in-place accumulation used for gradients. Outputs are split into fixed chunks of rows for
//! rayon; every element is computed by the same code whatever the thread count, so results are
//! deterministic.
//!
//! Speed: contiguous operands run as one flat loop per chunk; other layouts walk rows
//! (`walk::RowStarts`) and pick a row loop by the last axis's stride — 1 (slices, which LLVM
//! vectorises), 0 (a value broadcast along the row, e.g. a bias column) or general. Every path
//! applies the same per-element function to the same operands, so the fast paths change speed,
//! never results.
//!
//! Not for: reductions across elements (see `reduce`).

use super::math;
use super::simd::wide;
use super::walk::{RowStarts, inner_dim};
use crate::dtype::Elem;
use crate::shape::Layout;
use rayon::prelude::*;

/// Elements per parallel task; smaller outputs run on the calling thread.
const CHUNK: usize = 1 << 14;

/// Calls `visit(first_row, rows)` on chunks of whole rows (of `inner` elements) of a contiguous
/// output, in parallel when the output is larger than one chunk. Callers wrap their chunk body
/// in `wide` so its loops get AVX-512 where the CPU has it.
fn for_chunks<U: Send>(out: &mut [U], inner: usize, visit: impl Fn(usize, &mut [U]) + Sync) {
    if out.is_empty() || inner == 0 {
        return;
    }
    let rows_per_chunk = (CHUNK / inner).max(1);
    if out.len() <= CHUNK {
        visit(0, out);
    } else {
        out.par_chunks_mut(rows_per_chunk * inner)
            .enumerate()
            .for_each(|(c, chunk)| visit(c * rows_per_chunk, chunk));
    }
}

/// `out[j] = f(x[base + j·s])` for one row.
#[inline(always)]
fn row1<T: Elem, U: Elem>(x: &[T], base: usize, s: usize, out: &mut [U], f: &impl Fn(f32) -> f32) {
    let n = out.len();
    match s {
        1 => {
            for (o, &v) in out.iter_mut().zip(&x[base..base + n]) {
                *o = U::from_f32(f(v.to_f32()));
            }
        }
        // One value along the whole row: f is pure, so apply it once.
        0 => out.fill(U::from_f32(f(x[base].to_f32()))),
        _ => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = U::from_f32(f(x[base + j * s].to_f32()));
            }
        }
    }
}

/// `out[j] = f(a[ba + j·sa], b[bb + j·sb])` for one row.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn row2<T: Elem>(
    a: &[T],
    ba: usize,
    sa: usize,
    b: &[T],
    bb: usize,
    sb: usize,
    out: &mut [T],
    f: &impl Fn(f32, f32) -> f32,
) {
    let n = out.len();
    match (sa, sb) {
        (1, 1) => {
            for ((o, &p), &q) in out.iter_mut().zip(&a[ba..ba + n]).zip(&b[bb..bb + n]) {
                *o = T::from_f32(f(p.to_f32(), q.to_f32()));
            }
        }
        (1, 0) => {
            let q = b[bb].to_f32();
            for (o, &p) in out.iter_mut().zip(&a[ba..ba + n]) {
                *o = T::from_f32(f(p.to_f32(), q));
            }
        }
        (0, 1) => {
            let p = a[ba].to_f32();
            for (o, &q) in out.iter_mut().zip(&b[bb..bb + n]) {
                *o = T::from_f32(f(p, q.to_f32()));
            }
        }
        _ => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = T::from_f32(f(a[ba + j * sa].to_f32(), b[bb + j * sb].to_f32()));
            }
        }
    }
}

/// `out[i] = f(x[i])` for a contiguous `out` and any layout of `x` with the same shape.
pub fn map1<T: Elem, U: Elem>(x: &[T], lx: &Layout, out: &mut [U], f: impl Fn(f32) -> f32 + Sync) {
    let (inner, sx) = inner_dim(lx);
    if lx.is_contiguous() {
        let x = &x[lx.offset()..lx.offset() + out.len()];
        for_chunks(out, inner, |r0, chunk| {
            wide(
                #[inline(always)]
                || row1(x, r0 * inner, 1, chunk, &f),
            )
        });
        return;
    }
    for_chunks(out, inner, |r0, chunk| {
        let mut rows = RowStarts::new(lx, r0);
        wide(
            #[inline(always)]
            || {
                for row in chunk.chunks_mut(inner) {
                    row1(x, rows.next_start(), sx, row, &f);
                }
            },
        )
    });
}

/// `dst[i] = U::from_f32(src[i].to_f32())` over equal-length host slices, vectorised and in
/// parallel (the element loops of the kernels): for flat buffers the optimizer and the
/// gradient paths convert between f32 and 16 bits. Conversions are exact or correctly rounded
/// per element, so the bits are the sequential loop's.
pub fn convert_slice<T: Elem, U: Elem>(src: &[T], dst: &mut [U]) {
    assert_eq!(src.len(), dst.len(), "convert_slice needs equal lengths");
    map1(src, &Layout::contiguous(&[src.len()]), dst, |v| v);
}

/// `out[i] = x[i]` for a contiguous `out` and any same-shaped layout of `x`, bits unchanged:
/// row by row (a `memcpy` where the row is contiguous), in parallel.
pub fn gather<T: Copy + Send + Sync>(x: &[T], lx: &Layout, out: &mut [T]) {
    if lx.is_contiguous() {
        out.copy_from_slice(&x[lx.offset()..lx.offset() + out.len()]);
        return;
    }
    let (inner, sx) = inner_dim(lx);
    for_chunks(out, inner, |r0, chunk| {
        let mut rows = RowStarts::new(lx, r0);
        for row in chunk.chunks_mut(inner) {
            let base = rows.next_start();
            match sx {
                1 => row.copy_from_slice(&x[base..base + inner]),
                _ => {
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = x[base + j * sx];
                    }
                }
            }
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
        for_chunks(out, inner, |r0, chunk| {
            wide(
                #[inline(always)]
                || row2(a, r0 * inner, 1, b, r0 * inner, 1, chunk, &f),
            )
        });
        return;
    }
    for_chunks(out, inner, |r0, chunk| {
        let (mut ra, mut rb) = (RowStarts::new(la, r0), RowStarts::new(lb, r0));
        wide(
            #[inline(always)]
            || {
                for row in chunk.chunks_mut(inner) {
                    row2(a, ra.next_start(), sa, b, rb.next_start(), sb, row, &f);
                }
            },
        )
    });
}

/// GELU backward that also returns GELU's output, in one pass over contiguous `x`: `grad`
/// holds `dy` on entry and `dy ⊙ gelu'(x)` on return, and `y = gelu(x)` (for an op that
/// recomputes the output in backward; in place, so two buffers of x's size, not three).
pub fn gelu_grad_and_value<T: Elem>(x: &[T], grad: &mut [T], y: &mut [T]) {
    let n = grad.len();
    let body = |start: usize, gs: &mut [T], ys: &mut [T]| {
        wide(
            #[inline(always)]
            || {
                let xs = &x[start..start + gs.len()];
                for ((g, v), xv) in gs.iter_mut().zip(ys.iter_mut()).zip(xs) {
                    let (dx, value) = math::gelu_grad_and_value(xv.to_f32(), g.to_f32());
                    *g = T::from_f32(dx);
                    *v = T::from_f32(value);
                }
            },
        )
    };
    if n <= CHUNK {
        body(0, grad, y);
    } else {
        grad.par_chunks_mut(CHUNK)
            .zip(y.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(c, (d, v))| body(c * CHUNK, d, v));
    }
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
    if inner == 0 || lx.numel() == 0 {
        return;
    }
    let (mut rx, mut ro) = (RowStarts::new(lx, 0), RowStarts::new(lo, 0));
    for _ in 0..lx.numel() / inner {
        let (bx, bo) = (rx.next_start(), ro.next_start());
        match (sx, so) {
            (1, 1) => {
                for (o, &v) in out[bo..bo + inner].iter_mut().zip(&x[bx..bx + inner]) {
                    *o = convert(v);
                }
            }
            // A fill (or a value broadcast along the row) into a contiguous row.
            (0, 1) => {
                for o in &mut out[bo..bo + inner] {
                    *o = convert(x[bx]);
                }
            }
            _ => {
                for j in 0..inner {
                    out[bo + j * so] = convert(x[bx + j * sx]);
                }
            }
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
    let (inner, sx) = inner_dim(lx);
    let (_, so) = inner_dim(lo);
    if lo.is_contiguous() {
        let n = lo.numel();
        let dst = &mut out[lo.offset()..lo.offset() + n];
        let contiguous = lx.is_contiguous();
        for_chunks(dst, inner, |r0, chunk| {
            if contiguous {
                let xs = &x[lx.offset() + r0 * inner..lx.offset() + r0 * inner + chunk.len()];
                return wide(
                    #[inline(always)]
                    || {
                        for (o, &v) in chunk.iter_mut().zip(xs) {
                            *o = T::from_f32(f(o.to_f32(), v.to_f32()));
                        }
                    },
                );
            }
            let mut rows = RowStarts::new(lx, r0);
            for row in chunk.chunks_mut(inner) {
                let bx = rows.next_start();
                for (j, o) in row.iter_mut().enumerate() {
                    *o = T::from_f32(f(o.to_f32(), x[bx + j * sx].to_f32()));
                }
            }
        });
        return;
    }
    if inner == 0 || lo.numel() == 0 {
        return;
    }
    let (mut ro, mut rx) = (RowStarts::new(lo, 0), RowStarts::new(lx, 0));
    for _ in 0..lo.numel() / inner {
        let (bo, bx) = (ro.next_start(), rx.next_start());
        for j in 0..inner {
            let o = &mut out[bo + j * so];
            *o = T::from_f32(f(o.to_f32(), x[bx + j * sx].to_f32()));
        }
    }
}
