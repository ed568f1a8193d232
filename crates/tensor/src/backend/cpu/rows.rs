//! Row-wise CPU kernels over the last axis of contiguous data: softmax and log-softmax, layer
//! norm and RMS norm, each with its backward. Rows run in parallel; each row is reduced in a
//! fixed order in f32. Weight gradients are summed over rows sequentially (deterministic).
//!
//! Speed: element loops run over slices (no per-element index arithmetic or bounds checks) so
//! LLVM vectorises them; row sums stay sequential in index order, so the vectorised kernels
//! give the same bits as a plain scalar loop. Softmax computes each exponential once into a
//! per-task f32 row buffer instead of twice.
//!
//! Not for: general reductions (see `reduce`).

use super::math::fast_exp;
use super::reduce::column_block;
use super::row_sums::{LANES, row_sums};
use super::simd::wide;
use crate::dtype::Elem;
use rayon::prelude::*;

fn par_rows<U: Send>(out: &mut [U], c: usize, f: impl Fn(usize, &mut [U]) + Sync + Send) {
    if c == 0 {
        return;
    }
    out.par_chunks_mut(c)
        .enumerate()
        .for_each(|(r, row)| f(r, row));
}

/// Rows per parallel task of the kernels that keep a row buffer (about 16K elements a task).
pub(super) fn rows_per_task(c: usize) -> usize {
    ((1 << 14) / c.max(1)).max(1)
}

/// The largest element of a row, 16 lanes at a time. `max` is exact and order-free (NaNs are
/// skipped as by a sequential fold; only the sign of a zero maximum can differ, which no
/// caller can observe: it is only subtracted from the row before `exp` and added to a log).
pub(super) fn row_max<T: Elem>(xr: &[T]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut blocks = xr.chunks_exact(16);
    for b in &mut blocks {
        for (l, v) in lanes.iter_mut().zip(b) {
            *l = l.max(v.to_f32());
        }
    }
    let tail = blocks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, v| m.max(v.to_f32()));
    lanes.iter().fold(tail, |m, &l| m.max(l))
}

pub fn softmax<T: Elem>(x: &[T], c: usize, log: bool, y: &mut [T]) {
    if c == 0 {
        return;
    }
    let per = rows_per_task(c);
    y.par_chunks_mut(per * c)
        .enumerate()
        .for_each(|(task, ys)| {
            // exp(x − max) of up to LANES rows, in f32 whatever T is: (LANES, C)
            let mut e = vec![0.0f32; LANES * c];
            wide(
                #[inline(always)]
                || softmax_rows(x, c, log, task * per, ys, &mut e),
            )
        });
}

/// Softmax of the rows `ys` (starting at row `r0` of `x`), `LANES` rows at a time, with `e`
/// f32 scratch of `LANES` rows.
#[inline(always)]
fn softmax_rows<T: Elem>(x: &[T], c: usize, log: bool, r0: usize, ys: &mut [T], e: &mut [f32]) {
    for (b, yb) in ys.chunks_mut(LANES * c).enumerate() {
        let (rb, n) = (r0 + b * LANES, yb.len() / c);
        let xb = &x[rb * c..(rb + n) * c];
        let mut max = [0.0f32; LANES];
        for ((m, xr), er) in max.iter_mut().zip(xb.chunks(c)).zip(e.chunks_mut(c)) {
            *m = row_max(xr);
            for (ei, v) in er.iter_mut().zip(xr) {
                *ei = fast_exp(v.to_f32() - *m);
            }
        }
        let sums = row_sums(n, c, |k, j| e[k * c + j]);
        for (k, (yr, xr)) in yb.chunks_mut(c).zip(xb.chunks(c)).enumerate() {
            if log {
                let lse = max[k] + sums[k].ln();
                for (o, v) in yr.iter_mut().zip(xr) {
                    *o = T::from_f32(v.to_f32() - lse);
                }
            } else {
                for (o, &ei) in yr.iter_mut().zip(&e[k * c..(k + 1) * c]) {
                    *o = T::from_f32(ei / sums[k]);
                }
            }
        }
    }
}

/// softmax: dx = y ⊙ (dy − Σ dy⊙y); log-softmax: dx = dy − eʸ · Σ dy.
pub fn softmax_backward<T: Elem>(y: &[T], dy: &[T], c: usize, log: bool, dx: &mut [T]) {
    if c == 0 {
        return;
    }
    let per = rows_per_task(c);
    dx.par_chunks_mut(per * c)
        .enumerate()
        .for_each(|(task, ds)| {
            wide(
                #[inline(always)]
                || softmax_backward_rows(y, dy, c, log, task * per, ds),
            )
        });
}

/// Softmax backward of the rows `ds` (starting at row `r0`), `LANES` rows at a time.
#[inline(always)]
fn softmax_backward_rows<T: Elem>(y: &[T], dy: &[T], c: usize, log: bool, r0: usize, ds: &mut [T]) {
    for (b, db) in ds.chunks_mut(LANES * c).enumerate() {
        let (rb, n) = (r0 + b * LANES, db.len() / c);
        let (yb, gb) = (&y[rb * c..(rb + n) * c], &dy[rb * c..(rb + n) * c]);
        let s = if log {
            row_sums(n, c, |k, j| gb[k * c + j].to_f32())
        } else {
            row_sums(n, c, |k, j| gb[k * c + j].to_f32() * yb[k * c + j].to_f32())
        };
        for (k, ((dr, yr), gr)) in db
            .chunks_mut(c)
            .zip(yb.chunks(c))
            .zip(gb.chunks(c))
            .enumerate()
        {
            let s = s[k];
            if log {
                for ((o, v), g) in dr.iter_mut().zip(yr).zip(gr) {
                    *o = T::from_f32(g.to_f32() - fast_exp(v.to_f32()) * s);
                }
            } else {
                for ((o, v), g) in dr.iter_mut().zip(yr).zip(gr) {
                    *o = T::from_f32(v.to_f32() * (g.to_f32() - s));
                }
            }
        }
    }
}

/// y = (x − μ)·rstd·w + b, rstd = 1/√(σ² + eps), with μ and σ² (biased) per row. Each task
/// takes `LANES` rows: their inputs are widened to f32 once, and the statistics and outputs
/// computed from that copy (the weights are widened once for all tasks).
#[allow(clippy::too_many_arguments)]
pub fn layer_norm<T: Elem>(
    x: &[T],
    w: &[T],
    b: &[T],
    c: usize,
    eps: f32,
    y: &mut [T],
    mean: &mut [f32],
    rstd: &mut [f32],
) {
    if c == 0 {
        // μ = 0/0 and rstd = 1/√(0/0 + eps), as the sums of empty rows give.
        mean.fill(f32::NAN);
        rstd.fill(f32::NAN);
        return;
    }
    let (wf, bf) = (widened(w), widened(b));
    y.par_chunks_mut(LANES * c)
        .zip(mean.par_chunks_mut(LANES))
        .zip(rstd.par_chunks_mut(LANES))
        .enumerate()
        .for_each(|(blk, ((yb, m), s))| {
            let (rb, n) = (blk * LANES, m.len());
            let xb = &x[rb * c..(rb + n) * c];
            wide(
                #[inline(always)]
                || {
                    let xf = widened(xb);
                    let sums = row_sums(n, c, |k, j| xf[k * c + j]);
                    for (mu, sum) in m.iter_mut().zip(sums) {
                        *mu = sum / c as f32;
                    }
                    let sq = row_sums(n, c, |k, j| (xf[k * c + j] - m[k]).powi(2));
                    for (s, sq) in s.iter_mut().zip(sq) {
                        *s = 1.0 / (sq / c as f32 + eps).sqrt();
                    }
                    for (k, (yr, xr)) in yb.chunks_mut(c).zip(xf.chunks(c)).enumerate() {
                        let (mu, rs) = (m[k], s[k]);
                        for (((o, v), wj), bj) in yr.iter_mut().zip(xr).zip(&wf).zip(&bf) {
                            *o = T::from_f32((v - mu) * rs * wj + bj);
                        }
                    }
                },
            )
        });
}

/// `xs` in f32.
#[inline(always)]
fn widened<T: Elem>(xs: &[T]) -> Vec<f32> {
    xs.iter().map(|v| v.to_f32()).collect()
}

/// With x̂ = (x − μ)·rstd and g = dy⊙w: dx = rstd·(g − mean(g) − x̂·mean(g⊙x̂)),
/// dw = Σ_rows dy⊙x̂, db = Σ_rows dy. `acc` is f32 scratch of 2·C. Each task computes g and x̂
/// of its `LANES` rows once, in f32, for both row sums and the output.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward<T: Elem>(
    x: &[T],
    w: &[T],
    mean: &[f32],
    rstd: &[f32],
    dy: &[T],
    c: usize,
    dx: &mut [T],
    dw: &mut [T],
    db: &mut [T],
    acc: &mut [f32],
) {
    let wf = widened(w);
    dx.par_chunks_mut(LANES * c.max(1))
        .enumerate()
        .for_each(|(b, db)| {
            let (rb, n) = (b * LANES, db.len() / c.max(1));
            let (xb, gb) = (&x[rb * c..(rb + n) * c], &dy[rb * c..(rb + n) * c]);
            wide(
                #[inline(always)]
                || {
                    let mut g = vec![0.0f32; n * c];
                    let mut xh = vec![0.0f32; n * c];
                    for k in 0..n {
                        let (mu, rs) = (mean[rb + k], rstd[rb + k]);
                        let rows = k * c..(k + 1) * c;
                        for ((o, d), wj) in
                            g[rows.clone()].iter_mut().zip(&gb[rows.clone()]).zip(&wf)
                        {
                            *o = d.to_f32() * wj;
                        }
                        for (o, v) in xh[rows.clone()].iter_mut().zip(&xb[rows]) {
                            *o = (v.to_f32() - mu) * rs;
                        }
                    }
                    let mg = row_sums(n, c, |k, j| g[k * c + j]);
                    let mgx = row_sums(n, c, |k, j| g[k * c + j] * xh[k * c + j]);
                    for (k, ((dr, gr), hr)) in db
                        .chunks_mut(c)
                        .zip(g.chunks(c))
                        .zip(xh.chunks(c))
                        .enumerate()
                    {
                        let (rs, mg, mgx) = (rstd[rb + k], mg[k] / c as f32, mgx[k] / c as f32);
                        for ((o, gj), h) in dr.iter_mut().zip(gr).zip(hr) {
                            *o = T::from_f32(rs * (gj - mg - h * mgx));
                        }
                    }
                },
            )
        });
    let (aw, ab) = acc.split_at_mut(c);
    aw.fill(0.0);
    ab.fill(0.0);
    // dw and db down the rows, in row order per column, in column blocks across threads.
    let cols = column_block(c).min(c.max(1));
    aw.par_chunks_mut(cols)
        .zip(ab.par_chunks_mut(cols))
        .enumerate()
        .for_each(|(blk, (aw, ab))| {
            let j0 = blk * cols;
            wide(
                #[inline(always)]
                || {
                    for r in 0..mean.len() {
                        let (mu, rs) = (mean[r], rstd[r]);
                        let xr = &x[r * c + j0..r * c + j0 + aw.len()];
                        let gr = &dy[r * c + j0..r * c + j0 + aw.len()];
                        for (((a, b), d), v) in aw.iter_mut().zip(ab.iter_mut()).zip(gr).zip(xr) {
                            let d = d.to_f32();
                            *a += d * (v.to_f32() - mu) * rs;
                            *b += d;
                        }
                    }
                },
            )
        });
    for j in 0..c {
        dw[j] = T::from_f32(aw[j]);
        db[j] = T::from_f32(ab[j]);
    }
}

/// y = x·rstd·w, rstd = 1/√(mean(x²) + eps).
pub fn rms_norm<T: Elem>(x: &[T], w: &[T], c: usize, eps: f32, y: &mut [T], rstd: &mut [f32]) {
    rstd.par_iter_mut().enumerate().for_each(|(r, s)| {
        let ms = x[r * c..(r + 1) * c]
            .iter()
            .map(|v| v.to_f32().powi(2))
            .sum::<f32>()
            / c as f32;
        *s = 1.0 / (ms + eps).sqrt();
    });
    let stats = &*rstd;
    par_rows(y, c, |r, yr| {
        for (j, o) in yr.iter_mut().enumerate() {
            *o = T::from_f32(x[r * c + j].to_f32() * stats[r] * w[j].to_f32());
        }
    });
}

/// With x̂ = x·rstd and g = dy⊙w: dx = rstd·(g − x̂·mean(g⊙x̂)), dw = Σ_rows dy⊙x̂.
/// `acc` is f32 scratch of C.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_backward<T: Elem>(
    x: &[T],
    w: &[T],
    rstd: &[f32],
    dy: &[T],
    c: usize,
    dx: &mut [T],
    dw: &mut [T],
    acc: &mut [f32],
) {
    par_rows(dx, c, |r, dr| {
        let rs = rstd[r];
        let xh = |j: usize| x[r * c + j].to_f32() * rs;
        let g = |j: usize| dy[r * c + j].to_f32() * w[j].to_f32();
        let mgx = (0..c).map(|j| g(j) * xh(j)).sum::<f32>() / c as f32;
        for (j, o) in dr.iter_mut().enumerate() {
            *o = T::from_f32(rs * (g(j) - xh(j) * mgx));
        }
    });
    acc.fill(0.0);
    for r in 0..rstd.len() {
        for j in 0..c {
            acc[j] += dy[r * c + j].to_f32() * x[r * c + j].to_f32() * rstd[r];
        }
    }
    for j in 0..c {
        dw[j] = T::from_f32(acc[j]);
    }
}
