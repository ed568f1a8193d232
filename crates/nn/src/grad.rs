//! Gradient checks before an optimizer step: the global L2 norm (for clipping by global norm,
//! PyTorch's `clip_grad_norm_`) and whether any value is inf or nan (for the loss scaler), in one
//! pass, reduced in f64 in a fixed order so the result is the same on every run.
//!
//! Not for: changing gradients (the optimizer applies the clip factor inside its fused update).

use half::{bf16, f16};

/// Gradient storage of one flat buffer, in whichever dtype the precision mode keeps it.
#[derive(Debug, Clone, Copy)]
pub enum Grads<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

impl<'a> Grads<'a> {
    /// The gradients of elements `range` (a ZeRO shard of a flat buffer).
    pub fn range(&self, range: std::ops::Range<usize>) -> Grads<'a> {
        match *self {
            Grads::F32(g) => Grads::F32(&g[range]),
            Grads::Bf16(g) => Grads::Bf16(&g[range]),
            Grads::F16(g) => Grads::F16(&g[range]),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Grads::F32(g) => g.len(),
            Grads::Bf16(g) => g.len(),
            Grads::F16(g) => g.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as f32.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            Grads::F32(g) => g[i],
            Grads::Bf16(g) => g[i].to_f32(),
            Grads::F16(g) => g[i].to_f32(),
        }
    }
}

/// Sum of squares and finiteness of a set of gradients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradStats {
    pub sum_squares: f64,
    pub all_finite: bool,
}

impl GradStats {
    pub fn norm(&self) -> f64 {
        self.sum_squares.sqrt()
    }
}

/// One pass over every gradient buffer, in order.
pub fn grad_stats<'a>(grads: impl IntoIterator<Item = Grads<'a>>) -> GradStats {
    let mut sum_squares = 0.0f64;
    let mut all_finite = true;
    for g in grads {
        for i in 0..g.len() {
            let x = g.get(i);
            all_finite &= x.is_finite();
            sum_squares += (x as f64) * (x as f64);
        }
    }
    GradStats {
        sum_squares,
        all_finite,
    }
}

/// The factor gradients are multiplied by before the update: the loss scaler's `inv_scale`, times
/// the clip coefficient `max_norm / (norm + 1e-6)` when the unscaled norm exceeds `max_norm`
/// (PyTorch's `clip_grad_norm_` rule). `stats` are of the still-scaled gradients.
pub fn grad_multiplier(stats: &GradStats, inv_scale: f32, max_norm: Option<f32>) -> f32 {
    let unscaled_norm = stats.norm() * inv_scale as f64;
    let clip = match max_norm {
        Some(max) => (max as f64 / (unscaled_norm + 1e-6)).min(1.0),
        None => 1.0,
    };
    (inv_scale as f64 * clip) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_and_clip_follow_the_definition() {
        // Gradients (3, 4) and (12): norm = sqrt(9 + 16 + 144) = 13.
        let a = [3.0f32, 4.0];
        let b = [bf16::from_f32(12.0)];
        let s = grad_stats([Grads::F32(&a), Grads::Bf16(&b)]);
        assert_eq!(s.norm(), 13.0);
        assert!(s.all_finite);
        // Clip to 6.5: factor 6.5 / (13 + 1e-6).
        let m = grad_multiplier(&s, 1.0, Some(6.5));
        assert!((m - (6.5 / (13.0 + 1e-6)) as f32).abs() < 1e-7);
        // Scaled by 1024 with inv_scale 1/1024: the unscaled norm is still 13, below 20: no clip.
        let scaled = [3.0f32 * 1024.0, 4.0 * 1024.0, 12.0 * 1024.0];
        let s = grad_stats([Grads::F32(&scaled)]);
        assert_eq!(grad_multiplier(&s, 1.0 / 1024.0, Some(20.0)), 1.0 / 1024.0);
    }

    #[test]
    fn any_inf_or_nan_is_found() {
        let a = [1.0f32, f32::NAN];
        assert!(!grad_stats([Grads::F32(&a)]).all_finite);
        let h = [f16::INFINITY];
        assert!(!grad_stats([Grads::F16(&h)]).all_finite);
    }
}
