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
fn rows_per_task(c: usize) -> usize {
    ((1 << 14) / c.max(1)).max(1)
}

/// The largest element of a row, 16 lanes at a time. `max` is exact and order-free (NaNs are
/// skipped as by a sequential fold; only the sign of a zero maximum can differ, which no
/// caller can observe: it is only subtracted from the row before `exp` and added to a log).
fn row_max<T: Elem>(xr: &[T]) -> f32 {
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

/// Rows whose sequential sums run interleaved, one dependency chain per row.
const LANES: usize = 16;

/// `Σ_j term(k, j)` for each row `k < n ≤ LANES`, each summed in index order from −0.0 exactly
/// as `Iterator::sum` does (so the bits are those of a plain per-row `.sum()`). One row's sum
/// is a chain of dependent adds, bound by the add latency; interleaving the rows' chains lets
/// them overlap. The terms are first written column-major (`t[j·LANES + k]`), so the chains
/// advance as one 16-lane vector add per column instead of a gather across rows; each lane
/// still adds its row's terms in index order, so the bits do not change.
#[inline(always)]
fn row_sums(n: usize, c: usize, term: impl Fn(usize, usize) -> f32) -> [f32; LANES] {
    let mut t = vec![0.0f32; c * LANES];
    for k in 0..n {
        for (j, col) in t.chunks_exact_mut(LANES).enumerate() {
            col[k] = term(k, j);
        }
    }
    let mut acc = [-0.0f32; LANES];
    for col in t.chunks_exact(LANES) {
        for (a, v) in acc.iter_mut().zip(col) {
            *a += v;
        }
    }
    acc
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

/// y = (x − μ)·rstd·w + b, rstd = 1/√(σ² + eps), with μ and σ² (biased) per row.
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
    mean.par_chunks_mut(LANES)
        .zip(rstd.par_chunks_mut(LANES))
        .enumerate()
        .for_each(|(b, (m, s))| {
            let (rb, n) = (b * LANES, m.len());
            let xb = &x[rb * c..(rb + n) * c];
            wide(
                #[inline(always)]
                || {
                    let sums = row_sums(n, c, |k, j| xb[k * c + j].to_f32());
                    for (mu, sum) in m.iter_mut().zip(sums) {
                        *mu = sum / c as f32;
                    }
                    let m = &*m;
                    let sq = row_sums(n, c, |k, j| (xb[k * c + j].to_f32() - m[k]).powi(2));
                    for (s, sq) in s.iter_mut().zip(sq) {
                        *s = 1.0 / (sq / c as f32 + eps).sqrt();
                    }
                },
            )
        });
    let (mean, rstd) = (&*mean, &*rstd);
    par_rows(y, c, |r, yr| {
        let (mu, rs) = (mean[r], rstd[r]);
        let xr = &x[r * c..(r + 1) * c];
        wide(
            #[inline(always)]
            || {
                for (((o, v), wj), bj) in yr.iter_mut().zip(xr).zip(w).zip(b) {
                    *o = T::from_f32((v.to_f32() - mu) * rs * wj.to_f32() + bj.to_f32());
                }
            },
        )
    });
}

/// With x̂ = (x − μ)·rstd and g = dy⊙w: dx = rstd·(g − mean(g) − x̂·mean(g⊙x̂)),
/// dw = Σ_rows dy⊙x̂, db = Σ_rows dy. `acc` is f32 scratch of 2·C.
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
    dx.par_chunks_mut(LANES * c.max(1))
        .enumerate()
        .for_each(|(b, db)| {
            let (rb, n) = (b * LANES, db.len() / c.max(1));
            let (xb, gb) = (&x[rb * c..(rb + n) * c], &dy[rb * c..(rb + n) * c]);
            let xh = |k: usize, v: &T| (v.to_f32() - mean[rb + k]) * rstd[rb + k];
            let g = |d: &T, wj: &T| d.to_f32() * wj.to_f32();
            let (mg, mgx) = wide(
                #[inline(always)]
                || {
                    let mg = row_sums(n, c, |k, j| g(&gb[k * c + j], &w[j]));
                    let mgx = row_sums(n, c, |k, j| {
                        g(&gb[k * c + j], &w[j]) * xh(k, &xb[k * c + j])
                    });
                    (mg, mgx)
                },
            );
            for (k, ((dr, xr), gr)) in db
                .chunks_mut(c)
                .zip(xb.chunks(c))
                .zip(gb.chunks(c))
                .enumerate()
            {
                let (rs, mg, mgx) = (rstd[rb + k], mg[k] / c as f32, mgx[k] / c as f32);
                wide(
                    #[inline(always)]
                    || {
                        for (((o, d), wj), v) in dr.iter_mut().zip(gr).zip(w).zip(xr) {
                            *o = T::from_f32(rs * (g(d, wj) - mg - xh(k, v) * mgx));
                        }
                    },
                )
            }
        });
    let (aw, ab) = acc.split_at_mut(c);
    aw.fill(0.0);
    ab.fill(0.0);
    wide(
        #[inline(always)]
        || {
            for r in 0..mean.len() {
                let (mu, rs) = (mean[r], rstd[r]);
                let (xr, gr) = (&x[r * c..(r + 1) * c], &dy[r * c..(r + 1) * c]);
                for (((a, b), d), v) in aw.iter_mut().zip(ab.iter_mut()).zip(gr).zip(xr) {
                    let d = d.to_f32();
                    *a += d * (v.to_f32() - mu) * rs;
                    *b += d;
                }
            }
        },
    );
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
