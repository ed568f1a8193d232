//! Shared by the tensor benches: deterministic input values.

/// `len` values in [−0.5, 0.5) from a multiplicative hash of the index (the same inputs on
/// every run, with no generator state).
pub fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                / (1u32 << 24) as f32
                - 0.5
        })
        .collect()
}
