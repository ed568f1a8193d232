//! Learning-rate schedule: linear warm-up to the base rate, then cosine decay to a tenth of it
//! at the last step (the nanoGPT/GPT-3 recipe).
//!
//! Not for: per-parameter rates.

/// Learning rate for optimizer step `step` (0-based) of `total`.
pub fn learning_rate(base: f32, step: u64, warmup: u64, total: u64) -> f32 {
    if warmup > 0 && step < warmup {
        return base * (step + 1) as f32 / warmup as f32;
    }
    let min = base * 0.1;
    let span = total.saturating_sub(warmup).max(1);
    let progress = ((step - warmup.min(step)) as f64 / span as f64).min(1.0);
    min + (base - min) * (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_linearly_then_decays_to_a_tenth() {
        assert_eq!(learning_rate(1.0, 0, 10, 100), 0.1);
        assert_eq!(learning_rate(1.0, 9, 10, 100), 1.0);
        assert_eq!(learning_rate(1.0, 10, 10, 100), 1.0);
        // Half way through the decay: cos(π/2) = 0 → 0.1 + 0.9·0.5 = 0.55.
        assert!((learning_rate(1.0, 55, 10, 100) - 0.55).abs() < 1e-6);
        assert!((learning_rate(1.0, 100, 10, 100) - 0.1).abs() < 1e-6);
    }
}
