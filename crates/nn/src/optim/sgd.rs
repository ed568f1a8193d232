//! SGD with momentum, PyTorch's `torch.optim.SGD` rule: g ← g + wd·w (coupled L2);
//! buf ← g on the first step, then buf ← μ·buf + g; w ← w − lr·buf (Nesterov: w ← w − lr·(g + μ·buf)).
//!
//! Not for: state allocation (see `mod.rs`).

use super::state::StateElem;
use crate::grad::Grads;

/// Hyperparameters of one SGD update.
#[derive(Debug, Clone, Copy)]
pub struct SgdStep {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
    pub nesterov: bool,
    pub first_step: bool,
    /// Multiplies every gradient first (inverse loss scale × clip coefficient).
    pub grad_multiplier: f32,
}

/// Updates `params` in place; `buf` is the momentum buffer (absent when momentum is 0).
pub fn sgd_update<S: StateElem>(
    params: &mut [f32],
    grads: Grads<'_>,
    buf: Option<&mut [S]>,
    h: SgdStep,
) {
    match buf {
        None => {
            for (i, w) in params.iter_mut().enumerate() {
                let g = grads.get(i) * h.grad_multiplier + h.weight_decay * *w;
                *w -= h.lr * g;
            }
        }
        Some(buf) => {
            for (i, (w, b)) in params.iter_mut().zip(buf.iter_mut()).enumerate() {
                let g = grads.get(i) * h.grad_multiplier + h.weight_decay * *w;
                let m = if h.first_step {
                    g
                } else {
                    h.momentum * b.load() + g
                };
                *b = S::store(m);
                let d = if h.nesterov { g + h.momentum * m } else { m };
                *w -= h.lr * d;
            }
        }
    }
}
