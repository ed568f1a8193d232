//! LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning"), the large-batch
//! optimizer gradient accumulation is typically used with: Adam moments with bias correction,
//! update u = m̂ / (sqrt(v̂) + ε) + wd·w, and a per-tensor trust ratio ‖w‖ / ‖u‖ (1 when either
//! norm is 0): w ← w − lr · trust · u.
//!
//! The step runs in two passes so that a tensor cut by ZeRO's shards can be updated piece by
//! piece: [`lamb_sums`] reads the state and sums ‖w‖² and ‖u‖² of each tensor (or piece)
//! exactly ([`SquareSum`]), the caller completes the pieces' sums over ranks, and
//! [`lamb_apply`] updates the moments and weights with the whole tensors' trust ratios. As the
//! sums are exact, the trust ratio has the same bits however the tensor was cut.
//!
//! Not for: state allocation (see `mod.rs`) or the collective that completes the sums (the
//! trainer's).

use super::adamw::{AdamStep, next_moments, update_moments};
use super::square_sum::SquareSum;
use super::state::StateElem;
use crate::grad::Grads;
use std::ops::Range;

/// ‖w‖² and ‖u‖² of one tensor, or of the piece of it a shard holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorSums {
    pub weights: SquareSum,
    pub update: SquareSum,
}

impl TensorSums {
    /// Adds another piece of the same tensor.
    pub fn add(&mut self, other: &TensorSums) {
        self.weights.add(&other.weights);
        self.update.add(&other.update);
    }

    /// ‖w‖ / ‖u‖, or 1 when either norm is 0 (or not a number).
    pub fn trust_ratio(&self) -> f32 {
        let (w_norm, u_norm) = (self.weights.value().sqrt(), self.update.value().sqrt());
        if w_norm > 0.0 && u_norm > 0.0 {
            (w_norm / u_norm) as f32
        } else {
            1.0
        }
    }
}

/// One element's update u after gradient `g`, from its stored moments (read, not written).
#[inline]
fn lamb_step(w: f32, g: f32, m: f32, v: f32, h: &AdamStep, bc: (f32, f32)) -> f32 {
    let (mn, vn) = next_moments(g, m, v, h);
    direction(w, mn, vn, h, bc)
}

/// u = m̂ / (sqrt(v̂) + ε) + wd·w.
#[inline]
fn direction(w: f32, mn: f32, vn: f32, h: &AdamStep, (bc1, bc2): (f32, f32)) -> f32 {
    (mn / bc1) / ((vn / bc2).sqrt() + h.eps) + h.weight_decay * w
}

/// The sums of each of `tensors` (ranges of `params`) for this step; the state is only read.
pub fn lamb_sums<S: StateElem>(
    params: &[f32],
    grads: Grads<'_>,
    m: &[S],
    v: &[S],
    tensors: &[Range<usize>],
    h: AdamStep,
) -> Vec<TensorSums> {
    let bc = h.bias_corrections();
    tensors
        .iter()
        .map(|range| {
            let mut sums = TensorSums::default();
            for i in range.clone() {
                let g = grads.get(i) * h.grad_multiplier;
                let u = lamb_step(params[i], g, m[i].load(), v[i].load(), &h, bc);
                sums.weights.add_square(params[i]);
                sums.update.add_square(u);
            }
            sums
        })
        .collect()
}

/// Updates the moments and each of `tensors` with the trust ratio of its whole tensor's `sums`.
pub fn lamb_apply<S: StateElem>(
    params: &mut [f32],
    grads: Grads<'_>,
    m: &mut [S],
    v: &mut [S],
    tensors: &[Range<usize>],
    sums: &[TensorSums],
    h: AdamStep,
) {
    assert_eq!(tensors.len(), sums.len(), "one sum per tensor");
    let bc = h.bias_corrections();
    for (range, sums) in tensors.iter().zip(sums) {
        let trust = sums.trust_ratio();
        for i in range.clone() {
            let g = grads.get(i) * h.grad_multiplier;
            let (mn, vn) = update_moments(g, &mut m[i], &mut v[i], &h);
            let u = direction(params[i], mn, vn, &h, bc);
            params[i] -= h.lr * trust * u;
        }
    }
}

/// Updates each tensor (a range of the flat buffer, whole) with its own trust ratio.
pub fn lamb_update<S: StateElem>(
    params: &mut [f32],
    grads: Grads<'_>,
    m: &mut [S],
    v: &mut [S],
    tensors: &[Range<usize>],
    h: AdamStep,
) {
    let sums = lamb_sums(params, grads, m, v, tensors, h);
    lamb_apply(params, grads, m, v, tensors, &sums, h);
}
