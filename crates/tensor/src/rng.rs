//! The counter-based random stream used by dropout: the value at `(seed, counter)` is a pure
//! function of the two (a SplitMix64 finaliser of their mix), so any element of a mask can be
//! recomputed without storing it. A thread-local `(seed, offset)` cursor advances by the number
//! of elements each random op draws; a checkpoint scope records the cursor and restores it when
//! it re-runs, so the recompute sees the same masks.
//!
//! Not for: parameter initialisation quality (it is a hash, not a statistical RNG suite).

use std::cell::Cell;

/// The random cursor of the current thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RngState {
    pub seed: u64,
    pub offset: u64,
}

thread_local! {
    static STATE: Cell<RngState> = const { Cell::new(RngState { seed: 0, offset: 0 }) };
}

/// Restarts the current thread's stream at `seed`.
pub fn manual_seed(seed: u64) {
    STATE.with(|s| s.set(RngState { seed, offset: 0 }));
}

pub fn get_state() -> RngState {
    STATE.with(|s| s.get())
}

pub fn set_state(state: RngState) {
    STATE.with(|s| s.set(state));
}

/// Reserves `count` counters and returns the cursor they start at.
pub fn advance(count: u64) -> RngState {
    STATE.with(|s| {
        let now = s.get();
        s.set(RngState {
            seed: now.seed,
            offset: now.offset + count,
        });
        now
    })
}

/// A uniform number in [0, 1) for `(seed, counter)`, with 24 random bits.
#[inline(always)]
pub fn uniform(seed: u64, counter: u64) -> f32 {
    let mut z =
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ counter.wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_a_pure_function_with_a_flat_mean() {
        assert_eq!(uniform(7, 123), uniform(7, 123));
        // The mean of a uniform [0, 1) variable is 1/2; 100k draws have a standard error of
        // 1/√(12·100000) ≈ 0.0009.
        let mean = (0..100_000).map(|i| uniform(3, i) as f64).sum::<f64>() / 100_000.0;
        assert!((mean - 0.5).abs() < 0.005, "{mean}");
    }
}
