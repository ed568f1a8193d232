//! Adafactor (Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost",
//! ICML 2018, arXiv:1804.04235) without momentum, the paper's Algorithm 4 as Hugging Face's
//! `transformers.Adafactor` runs it with `relative_step=False, scale_parameter=False`:
//!
//! - decay β̂₂ = 1 − t^(−0.8) at step t (so the first step takes the squared gradient whole);
//! - a matrix (rows × cols) keeps the row means R and the column means C of G² + ε₁
//!   (ε₁ = 10⁻³⁰), each decayed at β̂₂, and estimates V̂ = R Cᵀ / mean(R); a vector keeps the
//!   decayed G² + ε₁ in full;
//! - the update U = G / √V̂ is scaled down to RMS(U) ≤ d = 1 per tensor, then by the learning
//!   rate; weight decay is decoupled (w ← w − lr·λ·w before the update).
//!
//! Means and the RMS are summed in f64, each row and column in index order (one thread), so the
//! result does not depend on the machine's threads. The row and column factors of 1/√V̂ are
//! host scratch of rows + cols values, not device memory.
//!
//! Not for: state allocation (see `mod.rs`).

use crate::grad::Grads;

/// ε₁, added to every squared gradient (HF's `eps[0]`).
pub const EPS1: f64 = 1e-30;
/// d, the RMS the update is clipped to (HF's `clip_threshold`).
pub const CLIP_THRESHOLD: f64 = 1.0;
/// The exponent of the decay schedule β̂₂ = 1 − t^DECAY_RATE (HF's `decay_rate`).
pub const DECAY_RATE: f64 = -0.8;

/// How one tensor of a flat buffer keeps its second moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorShape {
    /// Factored: `rows` row means and `cols` column means (the tensor's last axis is `cols`).
    Matrix { rows: usize, cols: usize },
    /// In full: one value per element.
    Vector(usize),
}

impl TensorShape {
    /// The shape of a tensor of dimensions `dims`: a matrix of the last axis by the product of
    /// the others when it has two axes or more, else a vector.
    pub fn of(dims: &[usize]) -> TensorShape {
        match dims {
            [.., cols] if dims.len() >= 2 => TensorShape::Matrix {
                rows: dims[..dims.len() - 1].iter().product(),
                cols: *cols,
            },
            _ => TensorShape::Vector(dims.iter().product()),
        }
    }

    /// Elements of the tensor.
    pub fn numel(self) -> usize {
        match self {
            TensorShape::Matrix { rows, cols } => rows * cols,
            TensorShape::Vector(n) => n,
        }
    }

    /// f32 values of its second-moment state.
    pub fn state_len(self) -> usize {
        match self {
            TensorShape::Matrix { rows, cols } => rows + cols,
            TensorShape::Vector(n) => n,
        }
    }
}

/// Hyperparameters of one Adafactor update.
#[derive(Debug, Clone, Copy)]
pub struct AdafactorStep {
    pub lr: f32,
    pub weight_decay: f32,
    /// 1-based step count (for the decay schedule).
    pub step: u64,
    /// Multiplies every gradient first (inverse loss scale × clip coefficient).
    pub grad_multiplier: f32,
}

impl AdafactorStep {
    /// β̂₂ of this step.
    pub fn decay(&self) -> f64 {
        1.0 - (self.step.max(1) as f64).powf(DECAY_RATE)
    }
}

/// One update of `params` (the tensors `shapes`, laid out in order) with gradients `grads` and
/// second-moment state `state` (each tensor's [`TensorShape::state_len`] values, in order).
pub fn adafactor_update(
    params: &mut [f32],
    grads: Grads<'_>,
    state: &mut [f32],
    shapes: &[TensorShape],
    h: AdafactorStep,
) {
    let (mut at, mut at_state) = (0, 0);
    for &shape in shapes {
        let n = shape.numel();
        let s = &mut state[at_state..at_state + shape.state_len()];
        update_tensor(
            &mut params[at..at + n],
            grads.range(at..at + n),
            s,
            shape,
            &h,
        );
        at += n;
        at_state += shape.state_len();
    }
}

fn update_tensor(
    w: &mut [f32],
    g: Grads<'_>,
    s: &mut [f32],
    shape: TensorShape,
    h: &AdafactorStep,
) {
    let beta = h.decay();
    let grad = |i: usize| (g.get(i) * h.grad_multiplier) as f64;
    let decayed = |old: f32, mean: f64| (beta * old as f64 + (1.0 - beta) * mean) as f32;
    let n = shape.numel();
    // A vector is one row of n columns.
    let (rows, cols) = match shape {
        TensorShape::Matrix { rows, cols } => (rows, cols),
        TensorShape::Vector(n) => (1, n),
    };
    // The preconditioner 1/√V̂ᵢⱼ as a row factor times a column factor: for a matrix
    // √(mean R / Rᵢ) · 1/√Cⱼ; for a vector 1 · 1/√vⱼ.
    let (row_factor, col_factor): (Vec<f64>, Vec<f64>) = match shape {
        TensorShape::Matrix { rows, cols } => {
            let (r, c) = s.split_at_mut(rows);
            let mut col_sums = vec![0.0f64; cols];
            for (i, ri) in r.iter_mut().enumerate() {
                let mut sum = 0.0;
                for (j, cs) in col_sums.iter_mut().enumerate() {
                    let sq = grad(i * cols + j).powi(2) + EPS1;
                    sum += sq;
                    *cs += sq;
                }
                *ri = decayed(*ri, sum / cols as f64);
            }
            for (cj, sum) in c.iter_mut().zip(&col_sums) {
                *cj = decayed(*cj, sum / rows as f64);
            }
            let mean_r = r.iter().map(|&x| x as f64).sum::<f64>() / rows as f64;
            (
                r.iter().map(|&ri| (mean_r / ri as f64).sqrt()).collect(),
                c.iter().map(|&cj| 1.0 / (cj as f64).sqrt()).collect(),
            )
        }
        TensorShape::Vector(_) => {
            for (i, v) in s.iter_mut().enumerate() {
                *v = decayed(*v, grad(i).powi(2) + EPS1);
            }
            (
                vec![1.0],
                s.iter().map(|&v| 1.0 / (v as f64).sqrt()).collect(),
            )
        }
    };
    let update = |i: usize, j: usize| grad(i * cols + j) * row_factor[i] * col_factor[j];
    let mut squares = 0.0f64;
    for i in 0..rows {
        for j in 0..cols {
            squares += update(i, j).powi(2);
        }
    }
    let rms = (squares / n.max(1) as f64).sqrt();
    let step = h.lr as f64 / (rms / CLIP_THRESHOLD).max(1.0);
    let keep = 1.0 - h.lr * h.weight_decay;
    for i in 0..rows {
        for (j, wij) in w[i * cols..(i + 1) * cols].iter_mut().enumerate() {
            let decayed_w = if h.weight_decay != 0.0 {
                *wij * keep
            } else {
                *wij
            };
            *wij = (decayed_w as f64 - step * update(i, j)) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(t: u64) -> AdafactorStep {
        AdafactorStep {
            lr: 0.1,
            weight_decay: 0.0,
            step: t,
            grad_multiplier: 1.0,
        }
    }

    #[test]
    fn shapes_factor_matrices_and_keep_vectors() {
        assert_eq!(
            TensorShape::of(&[4, 3]),
            TensorShape::Matrix { rows: 4, cols: 3 }
        );
        assert_eq!(
            TensorShape::of(&[2, 4, 3]),
            TensorShape::Matrix { rows: 8, cols: 3 }
        );
        assert_eq!(TensorShape::of(&[5]), TensorShape::Vector(5));
        assert_eq!(TensorShape::of(&[4, 3]).state_len(), 7);
        assert_eq!(TensorShape::of(&[5]).state_len(), 5);
    }

    #[test]
    fn the_first_step_of_a_matrix_follows_the_paper_by_hand() {
        // β̂₂ = 1 − 1^−0.8 = 0 at step 1: R and C are the plain means of G² (ε₁ is negligible).
        // G = [[1, 2], [3, 4]]: G² = [[1, 4], [9, 16]]; R = [2.5, 12.5], C = [5, 10],
        // mean(R) = 7.5. V̂ᵢⱼ = Rᵢ Cⱼ / 7.5 = [[5/3, 10/3], [25/3, 50/3]].
        // U = G / √V̂ = [[0.7746, 1.0954], [1.0392, 0.9798]]; RMS(U) = 0.9798 < 1: no clipping.
        let mut w = [0.0f32; 4];
        let g = [1.0f32, 2.0, 3.0, 4.0];
        let mut s = [0.0f32; 4];
        let shape = [TensorShape::Matrix { rows: 2, cols: 2 }];
        adafactor_update(&mut w, Grads::F32(&g), &mut s, &shape, step(1));
        assert_eq!(s, [2.5, 12.5, 5.0, 10.0]);
        let v: [f64; 4] = [5.0 / 3.0, 10.0 / 3.0, 25.0 / 3.0, 50.0 / 3.0];
        for i in 0..4 {
            let want = -0.1 * g[i] as f64 / v[i].sqrt();
            assert!(
                (w[i] as f64 - want).abs() < 1e-6,
                "w[{i}] = {} vs {want}",
                w[i]
            );
        }
    }

    #[test]
    fn the_update_is_clipped_to_unit_rms_and_decays_the_state() {
        // A vector with one large gradient: at step 1 U = G/|G| = ±1 everywhere (RMS 1, no
        // clipping). At step 2, β̂₂ = 1 − 2^−0.8 = 0.4257: with the same gradient V keeps G²,
        // so U is ±1 again.
        let g = [3.0f32, -0.5, 0.25];
        let (mut w, mut s) = ([0.0f32; 3], [0.0f32; 3]);
        let shape = [TensorShape::Vector(3)];
        adafactor_update(&mut w, Grads::F32(&g), &mut s, &shape, step(1));
        for (i, &wi) in w.iter().enumerate() {
            assert!((wi + 0.1 * g[i].signum()).abs() < 1e-6, "{w:?}");
        }
        adafactor_update(&mut w, Grads::F32(&g), &mut s, &shape, step(2));
        for (i, &si) in s.iter().enumerate() {
            assert!((si - g[i] * g[i]).abs() < 1e-5 * g[i] * g[i], "{s:?}");
        }
        // Gradients ten times smaller than the state expects, at step 3 (β̂₂ = 1 − 3^−0.8):
        // V = β̂₂·G² + (1 − β̂₂)·G²/100, so |U| = 0.1 / √(β̂₂ + (1 − β̂₂)/100) for every element,
        // an RMS below 1: the step is lr·U, not clipped up.
        let small = [0.3f32, -0.05, 0.025];
        let before = w;
        adafactor_update(&mut w, Grads::F32(&small), &mut s, &shape, step(3));
        let beta = 1.0 - 3f64.powf(-0.8);
        let u = 0.1 / (beta + (1.0 - beta) / 100.0).sqrt();
        for i in 0..3 {
            let moved = (w[i] - before[i]) as f64;
            assert!(
                (moved + 0.1 * u * g[i].signum() as f64).abs() < 1e-6,
                "{moved}"
            );
        }
        // A diagonal gradient defeats the factored estimate: G = I₂ gives R = C = [½, ½] and
        // V̂ = ¼ everywhere, so U = [[2, 0], [0, 2]] with RMS √2, scaled down to RMS 1.
        let g = [1.0f32, 0.0, 0.0, 1.0];
        let (mut w, mut s) = ([0.0f32; 4], [0.0f32; 4]);
        let shape = [TensorShape::Matrix { rows: 2, cols: 2 }];
        adafactor_update(&mut w, Grads::F32(&g), &mut s, &shape, step(1));
        let want = -0.1 * 2.0 / 2f64.sqrt();
        assert!(
            (w[0] as f64 - want).abs() < 1e-6 && (w[3] as f64 - want).abs() < 1e-6,
            "{w:?}"
        );
        assert_eq!((w[1], w[2]), (0.0, 0.0));
    }
}
