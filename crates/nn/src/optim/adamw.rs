//! AdamW, PyTorch's `torch.optim.AdamW` rule (Loshchilov & Hutter 2019): decoupled decay
//! w ← w·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
//! w ← w − lr·(m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + ε).
//!
//! Not for: state allocation (see `mod.rs`).

use super::state::StateElem;
use crate::grad::Grads;

/// Hyperparameters of one Adam-family update.
#[derive(Debug, Clone, Copy)]
pub struct AdamStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1-based step count (for bias correction).
    pub step: u64,
    /// Multiplies every gradient first (inverse loss scale × clip coefficient).
    pub grad_multiplier: f32,
}

impl AdamStep {
    /// Bias corrections 1 − β^t, computed in f64 as PyTorch does on the host.
    pub fn bias_corrections(&self) -> (f32, f32) {
        let t = self.step as i32;
        (
            (1.0 - (self.beta1 as f64).powi(t)) as f32,
            (1.0 - (self.beta2 as f64).powi(t)) as f32,
        )
    }
}

/// The moments after gradient `g`, in f32 (before any rounding to the state's format).
#[inline]
pub(crate) fn next_moments(g: f32, m: f32, v: f32, h: &AdamStep) -> (f32, f32) {
    let mn = h.beta1 * m + (1.0 - h.beta1) * g;
    let vn = h.beta2 * v + (1.0 - h.beta2) * g * g;
    (mn, vn)
}

/// Updates the moments in place and returns their f32 values; shared by AdamW and LAMB.
#[inline]
pub(crate) fn update_moments<S: StateElem>(
    g: f32,
    m: &mut S,
    v: &mut S,
    h: &AdamStep,
) -> (f32, f32) {
    let (mn, vn) = next_moments(g, m.load(), v.load(), h);
    *m = S::store(mn);
    *v = S::store(vn);
    (mn, vn)
}

pub fn adamw_update<S: StateElem>(
    params: &mut [f32],
    grads: Grads<'_>,
    m: &mut [S],
    v: &mut [S],
    h: AdamStep,
) {
    let (bc1, bc2) = h.bias_corrections();
    let step_size = h.lr / bc1;
    let bc2_sqrt = bc2.sqrt();
    for (i, w) in params.iter_mut().enumerate() {
        let g = grads.get(i) * h.grad_multiplier;
        *w *= 1.0 - h.lr * h.weight_decay;
        let (mn, vn) = update_moments(g, &mut m[i], &mut v[i], &h);
        let denom = vn.sqrt() / bc2_sqrt + h.eps;
        *w -= step_size * mn / denom;
    }
}
