//! The rotary position embedding kernel (RoFormer, Su et al. 2021) in the "rotate half" layout
//! of the Llama family's Hugging Face implementation: the features of a head are paired as
//! `(i, i + D/2)` and pair `i` at position `p` is rotated by the angle whose cosine and sine are
//! `cos[p, i]`, `sin[p, i]`. The inverse rotation (the angle negated) is its gradient.
//!
//! Not for: the tables of angles (the model's rotary module computes them).

use crate::dtype::Elem;
use rayon::prelude::*;

/// `y` = `x` rotated, `x` and `y` contiguous `(N, T, H, D)`, `cos` and `sin` `(T, D/2)`;
/// `inverse` rotates by the negated angles. Computed in f32, rounded once to `T`.
#[allow(clippy::too_many_arguments)]
pub fn rope<T: Elem>(
    x: &[T],
    cos: &[f32],
    sin: &[f32],
    t: usize,
    h: usize,
    d: usize,
    inverse: bool,
    y: &mut [T],
) {
    if d == 0 {
        return;
    }
    let half = d / 2;
    let sign = if inverse { -1.0 } else { 1.0 };
    let n = x.len();
    y[..n].par_chunks_mut(d).enumerate().for_each(|(r, out)| {
        let p = (r / h) % t;
        let row = &x[r * d..(r + 1) * d];
        let (c, s) = (
            &cos[p * half..(p + 1) * half],
            &sin[p * half..(p + 1) * half],
        );
        for i in 0..half {
            let (x1, x2) = (row[i].to_f32(), row[i + half].to_f32());
            let (ci, si) = (c[i], sign * s[i]);
            out[i] = T::from_f32(x1 * ci - x2 * si);
            out[i + half] = T::from_f32(x2 * ci + x1 * si);
        }
    });
}
