//! Row-wise CPU kernels over the last axis of contiguous data: softmax and log-softmax, layer
//! norm and RMS norm, each with its backward. Rows run in parallel; each row is reduced in a
//! fixed order in f32. Weight gradients are summed over rows sequentially (deterministic).
//!
//! Not for: general reductions (see `reduce`).

use super::math::fast_exp;
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

pub fn softmax<T: Elem>(x: &[T], c: usize, log: bool, y: &mut [T]) {
    par_rows(y, c, |r, yr| {
        let xr = &x[r * c..(r + 1) * c];
        let max = xr.iter().fold(f32::NEG_INFINITY, |m, v| m.max(v.to_f32()));
        let sum: f32 = xr.iter().map(|v| fast_exp(v.to_f32() - max)).sum();
        if log {
            let lse = max + sum.ln();
            for (o, v) in yr.iter_mut().zip(xr) {
                *o = T::from_f32(v.to_f32() - lse);
            }
        } else {
            for (o, v) in yr.iter_mut().zip(xr) {
                *o = T::from_f32(fast_exp(v.to_f32() - max) / sum);
            }
        }
    });
}

/// softmax: dx = y ⊙ (dy − Σ dy⊙y); log-softmax: dx = dy − eʸ · Σ dy.
pub fn softmax_backward<T: Elem>(y: &[T], dy: &[T], c: usize, log: bool, dx: &mut [T]) {
    par_rows(dx, c, |r, dr| {
        let (yr, gr) = (&y[r * c..(r + 1) * c], &dy[r * c..(r + 1) * c]);
        if log {
            let s: f32 = gr.iter().map(|g| g.to_f32()).sum();
            for ((o, v), g) in dr.iter_mut().zip(yr).zip(gr) {
                *o = T::from_f32(g.to_f32() - fast_exp(v.to_f32()) * s);
            }
        } else {
            let s: f32 = gr
                .iter()
                .zip(yr)
                .map(|(g, v)| g.to_f32() * v.to_f32())
                .sum();
            for ((o, v), g) in dr.iter_mut().zip(yr).zip(gr) {
                *o = T::from_f32(v.to_f32() * (g.to_f32() - s));
            }
        }
    });
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
    mean.par_iter_mut()
        .zip(rstd.par_iter_mut())
        .enumerate()
        .for_each(|(r, (m, s))| {
            let xr = &x[r * c..(r + 1) * c];
            let mu = xr.iter().map(|v| v.to_f32()).sum::<f32>() / c as f32;
            let var = xr.iter().map(|v| (v.to_f32() - mu).powi(2)).sum::<f32>() / c as f32;
            *m = mu;
            *s = 1.0 / (var + eps).sqrt();
        });
    let (mean, rstd) = (&*mean, &*rstd);
    par_rows(y, c, |r, yr| {
        let (mu, rs) = (mean[r], rstd[r]);
        for (j, o) in yr.iter_mut().enumerate() {
            *o = T::from_f32((x[r * c + j].to_f32() - mu) * rs * w[j].to_f32() + b[j].to_f32());
        }
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
    par_rows(dx, c, |r, dr| {
        let (mu, rs) = (mean[r], rstd[r]);
        let xh = |j: usize| (x[r * c + j].to_f32() - mu) * rs;
        let g = |j: usize| dy[r * c + j].to_f32() * w[j].to_f32();
        let mg = (0..c).map(g).sum::<f32>() / c as f32;
        let mgx = (0..c).map(|j| g(j) * xh(j)).sum::<f32>() / c as f32;
        for (j, o) in dr.iter_mut().enumerate() {
            *o = T::from_f32(rs * (g(j) - mg - xh(j) * mgx));
        }
    });
    let (aw, ab) = acc.split_at_mut(c);
    aw.fill(0.0);
    ab.fill(0.0);
    for r in 0..mean.len() {
        for j in 0..c {
            let d = dy[r * c + j].to_f32();
            aw[j] += d * (x[r * c + j].to_f32() - mean[r]) * rstd[r];
            ab[j] += d;
        }
    }
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
