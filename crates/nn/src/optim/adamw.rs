//! AdamW, PyTorch's `torch.optim.AdamW` rule (Loshchilov & Hutter 2019): decoupled decay
//! w ← w·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
//! w ← w − lr·(m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + ε).
//!
//! The loop runs over zipped slices (no index checks, so the compiler vectorises it) in
//! chunks spread over the rayon pool, as DeepSpeed's CPU Adam spreads its AVX loop over OpenMP
//! threads; each element's operations are the same in any chunking, so the result is bitwise
//! that of one plain loop.
//!
//! Not for: state allocation (see `mod.rs`).

use super::state::StateElem;
use crate::grad::Grads;
use rayon::prelude::*;

/// Elements per parallel chunk: large enough that scheduling costs nothing next to the work.
const CHUNK: usize = 1 << 15;

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
    assert!(
        grads.len() == params.len() && m.len() == params.len() && v.len() == params.len(),
        "AdamW over {} parameters with {} gradients and states of {} and {}",
        params.len(),
        grads.len(),
        m.len(),
        v.len()
    );
    match grads {
        Grads::F32(g) => chunked(params, g, m, v, &h, |x| *x),
        Grads::Bf16(g) => chunked(params, g, m, v, &h, |x| x.to_f32()),
        Grads::F16(g) => chunked(params, g, m, v, &h, |x| x.to_f32()),
    }
}

/// [`adamw_update`] over chunks in parallel, gradients of type `G` read through `load`.
fn chunked<S: StateElem, G: Sync>(
    params: &mut [f32],
    grads: &[G],
    m: &mut [S],
    v: &mut [S],
    h: &AdamStep,
    load: impl Fn(&G) -> f32 + Sync,
) {
    params
        .par_chunks_mut(CHUNK)
        .zip(grads.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .for_each(|(((w, g), m), v)| adamw_chunk(w, g, m, v, h, &load));
}

#[inline(always)]
fn adamw_chunk<S: StateElem, G>(
    params: &mut [f32],
    grads: &[G],
    m: &mut [S],
    v: &mut [S],
    h: &AdamStep,
    load: &impl Fn(&G) -> f32,
) {
    let (bc1, bc2) = h.bias_corrections();
    let step_size = h.lr / bc1;
    let bc2_sqrt = bc2.sqrt();
    let decay = 1.0 - h.lr * h.weight_decay;
    for (((w, g), m), v) in params.iter_mut().zip(grads).zip(m).zip(v) {
        let g = load(g) * h.grad_multiplier;
        *w *= decay;
        let (mn, vn) = update_moments(g, m, v, h);
        let denom = vn.sqrt() / bc2_sqrt + h.eps;
        *w -= step_size * mn / denom;
    }
}
