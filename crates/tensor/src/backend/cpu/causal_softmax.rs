//! Fused causal softmax over the last axis of `(…, Tq, Tk)` scores: `softmax(mask(x · scale))`
//! where row `i` of each `Tq × Tk` matrix keeps columns `0..=i` (with a sliding window of `w`,
//! Mistral's, columns `i + 1 − w ..= i`), and its backward. It gives the
//! bits of the three separate ops (scale, then the −∞ mask, then softmax; in backward softmax's
//! rule, the mask's zeroing and the scale) while reading and computing only the kept columns:
//! about half of a square matrix. The masked entries of the separate ops contribute exact zeros
//! (e^−∞ = 0 to the sums, 0 to the outputs), so leaving them out changes no bit; backward's
//! final `· scale + 0.0` (the scale op's rule) turns the one difference left, the sign of a
//! zero, into +0 on both sides.
//!
//! Not for: the unmasked softmax (see `rows`), or attention without materialised scores (see
//! `attention`).

use super::math::fast_exp;
use super::row_sums::{LANES, row_sums};
use super::rows::{row_max, rows_per_task};
use super::simd::wide;
use crate::dtype::Elem;
use rayon::prelude::*;

/// The mask: `tq` rows of `tk` columns to a matrix, and the sliding window if any.
#[derive(Clone, Copy, Debug)]
pub struct Mask {
    pub tq: usize,
    pub tk: usize,
    pub window: Option<usize>,
}

impl Mask {
    /// Columns row `r` keeps, `start..end`: `0..=i` for its position `i = r mod tq` in its
    /// matrix, the last `w` of them under a window of `w`.
    #[inline(always)]
    fn kept(&self, r: usize) -> (usize, usize) {
        let end = (r % self.tq.max(1) + 1).min(self.tk);
        let start = self.window.map_or(0, |w| end.saturating_sub(w));
        (start, end)
    }
}

/// `y = softmax(mask(x · scale))` over rows of `tk`, `tq` rows to a matrix.
pub fn causal_softmax<T: Elem>(x: &[T], mask: Mask, scale: f32, y: &mut [T]) {
    let tk = mask.tk;
    if tk == 0 {
        return;
    }
    let per = rows_per_task(tk);
    y.par_chunks_mut(per * tk)
        .enumerate()
        .for_each(|(task, ys)| {
            // The kept exponentials of up to LANES rows, in f32 whatever T is: (LANES, Tk).
            let mut e = vec![0.0f32; LANES * tk];
            wide(
                #[inline(always)]
                || forward_rows(x, mask, scale, task * per, ys, &mut e),
            )
        });
}

#[inline(always)]
fn forward_rows<T: Elem>(x: &[T], mask: Mask, scale: f32, r0: usize, ys: &mut [T], e: &mut [f32]) {
    let tk = mask.tk;
    for (b, yb) in ys.chunks_mut(LANES * tk).enumerate() {
        let (rb, n) = (r0 + b * LANES, yb.len() / tk);
        let xb = &x[rb * tk..(rb + n) * tk];
        let mut width = 0;
        for (k, (xr, er)) in xb.chunks(tk).zip(e.chunks_mut(tk)).enumerate() {
            let (s, l) = mask.kept(rb + k);
            width = width.max(l);
            // The scale op's output, rounded to T as it would be stored.
            for (ei, v) in er[s..l].iter_mut().zip(&xr[s..l]) {
                *ei = T::from_f32(v.to_f32() * scale + 0.0).to_f32();
            }
            let m = row_max(&er[s..l]);
            for ei in &mut er[s..l] {
                *ei = fast_exp(*ei - m);
            }
            // The window's masked columns add exact zeros to the sum.
            er[..s].fill(0.0);
        }
        for (k, er) in e.chunks_mut(tk).take(n).enumerate() {
            er[mask.kept(rb + k).1..width].fill(0.0);
        }
        let sums = row_sums(n, width, |k, j| e[k * tk + j]);
        for (k, yr) in yb.chunks_mut(tk).enumerate() {
            let (s, l) = mask.kept(rb + k);
            yr[..s].fill(T::from_f32(0.0));
            for (o, &ei) in yr[s..l].iter_mut().zip(&e[k * tk + s..k * tk + l]) {
                *o = T::from_f32(ei / sums[k]);
            }
            yr[l..].fill(T::from_f32(0.0));
        }
    }
}

/// `dx = scale · mask(y ⊙ (dy − Σ dy⊙y))` from the output `y`, each product rounded to T
/// before the scale as the separate ops store it.
pub fn causal_softmax_backward<T: Elem>(y: &[T], dy: &[T], mask: Mask, scale: f32, dx: &mut [T]) {
    let tk = mask.tk;
    if tk == 0 {
        return;
    }
    let per = rows_per_task(tk);
    dx.par_chunks_mut(per * tk)
        .enumerate()
        .for_each(|(task, ds)| {
            wide(
                #[inline(always)]
                || backward_rows(y, dy, mask, scale, task * per, ds),
            )
        });
}

#[inline(always)]
fn backward_rows<T: Elem>(y: &[T], dy: &[T], mask: Mask, scale: f32, r0: usize, ds: &mut [T]) {
    let tk = mask.tk;
    for (b, db) in ds.chunks_mut(LANES * tk).enumerate() {
        let (rb, n) = (r0 + b * LANES, db.len() / tk);
        let (yb, gb) = (&y[rb * tk..(rb + n) * tk], &dy[rb * tk..(rb + n) * tk]);
        let width = (0..n).map(|k| mask.kept(rb + k).1).max().unwrap_or(0);
        let s = row_sums(n, width, |k, j| {
            let (start, end) = mask.kept(rb + k);
            if (start..end).contains(&j) {
                gb[k * tk + j].to_f32() * yb[k * tk + j].to_f32()
            } else {
                0.0
            }
        });
        for (k, dr) in db.chunks_mut(tk).enumerate() {
            let (start, l) = mask.kept(rb + k);
            let (yr, gr) = (
                &yb[k * tk + start..k * tk + l],
                &gb[k * tk + start..k * tk + l],
            );
            dr[..start].fill(T::from_f32(0.0));
            for ((o, v), g) in dr[start..l].iter_mut().zip(yr).zip(gr) {
                let d = T::from_f32(v.to_f32() * (g.to_f32() - s[k]));
                *o = T::from_f32(d.to_f32() * scale + 0.0);
            }
            dr[l..].fill(T::from_f32(0.0));
        }
    }
}
