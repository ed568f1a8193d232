//! LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning"), the large-batch
//! optimizer gradient accumulation is typically used with: Adam moments with bias correction,
//! update u = m̂ / (sqrt(v̂) + ε) + wd·w, and a per-tensor trust ratio ‖w‖ / ‖u‖ (1 when either
//! norm is 0): w ← w − lr · trust · u. Norms are reduced in f64 in a fixed order.
//!
//! Not for: state allocation (see `mod.rs`).

use super::adamw::{AdamStep, update_moments};
use super::state::StateElem;
use crate::grad::Grads;
use std::ops::Range;

/// Updates each tensor (a range of the flat buffer) with its own trust ratio.
pub fn lamb_update<S: StateElem>(
    params: &mut [f32],
    grads: Grads<'_>,
    m: &mut [S],
    v: &mut [S],
    tensors: &[Range<usize>],
    h: AdamStep,
) {
    let (bc1, bc2) = h.bias_corrections();
    let mut update = Vec::new();
    for range in tensors {
        update.clear();
        let (mut w_sq, mut u_sq) = (0.0f64, 0.0f64);
        for i in range.clone() {
            let g = grads.get(i) * h.grad_multiplier;
            let (mn, vn) = update_moments(g, &mut m[i], &mut v[i], &h);
            let u = (mn / bc1) / ((vn / bc2).sqrt() + h.eps) + h.weight_decay * params[i];
            w_sq += (params[i] as f64) * (params[i] as f64);
            u_sq += (u as f64) * (u as f64);
            update.push(u);
        }
        let (w_norm, u_norm) = (w_sq.sqrt(), u_sq.sqrt());
        let trust = if w_norm > 0.0 && u_norm > 0.0 {
            (w_norm / u_norm) as f32
        } else {
            1.0
        };
        for (i, u) in range.clone().zip(&update) {
            params[i] -= h.lr * trust * u;
        }
    }
}
