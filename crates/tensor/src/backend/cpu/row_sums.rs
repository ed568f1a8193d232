//! Sums of up to sixteen rows at once, each in index order: the reduction of the row kernels
//! (softmax, layer norm) that keeps the bits of a plain per-row `.sum()`. One row's sum is a
//! chain of dependent adds, bound by the add latency; running sixteen rows' chains side by side
//! as the lanes of one vector lets them overlap, and each lane still adds its own row's terms
//! in index order.
//!
//! The terms are computed row by row (contiguous, so the term loops vectorise) and then turned
//! column-wise: with AVX-512, sixteen 16-column tiles at a time transposed in registers (three
//! rounds of shuffles); elsewhere by writing them column-major one by one. Either way lane `k`
//! sees `term(k, 0), term(k, 1), …` in that order, so both give the same bits.
//!
//! Not for: reductions over other axes (see `reduce`).

/// Rows whose sequential sums run interleaved, one dependency chain per row.
pub(super) const LANES: usize = 16;

/// `Σ_j term(k, j)` for each row `k < n ≤ LANES`, each summed in index order from −0.0 exactly
/// as `Iterator::sum` does (so the bits are those of a plain per-row `.sum()`).
#[inline(always)]
pub(super) fn row_sums(n: usize, c: usize, term: impl Fn(usize, usize) -> f32) -> [f32; LANES] {
    #[cfg(target_arch = "x86_64")]
    if n == LANES && c >= LANES && std::is_x86_feature_detected!("avx512f") {
        let mut t = vec![0.0f32; LANES * c]; // row-major (LANES, c)
        for (k, row) in t.chunks_exact_mut(c).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = term(k, j);
            }
        }
        // SAFETY: AVX-512F is present (checked above) and `t` holds LANES rows of `c`.
        return unsafe { transposed_sums(&t, c) };
    }
    let mut t = vec![0.0f32; c * LANES]; // column-major: t[j·LANES + k]
    for k in 0..n {
        for (j, col) in t.chunks_exact_mut(LANES).enumerate() {
            col[k] = term(k, j);
        }
    }
    let mut acc = [-0.0f32; LANES];
    for col in t.chunks_exact(LANES) {
        for (a, v) in acc.iter_mut().zip(col) {
            *a += v;
        }
    }
    acc
}

/// Row sums of the row-major `(LANES, c)` buffer `t`: each 16 × 16 tile is transposed in
/// registers so that vector `jj` holds column `j0 + jj` of all sixteen rows, then added to the
/// accumulator column by column; the last `c mod 16` columns are added lane by lane.
///
/// # Safety
/// The CPU must support AVX-512F, and `t.len() >= LANES * c`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transposed_sums(t: &[f32], c: usize) -> [f32; LANES] {
    use std::arch::x86_64::*;
    debug_assert!(t.len() >= LANES * c);
    let mut acc = _mm512_set1_ps(-0.0);
    let full = c / LANES * LANES;
    for j0 in (0..full).step_by(LANES) {
        // SAFETY: row k's columns j0..j0 + 16 lie inside row k (j0 + 16 ≤ full ≤ c).
        let r: [__m512; 16] =
            std::array::from_fn(|k| unsafe { _mm512_loadu_ps(t.as_ptr().add(k * c + j0)) });
        for col in super::simd::transpose16_ps(r) {
            acc = _mm512_add_ps(acc, col);
        }
    }
    let mut out = [0.0f32; LANES];
    // SAFETY: `out` has room for 16 f32.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    for j in full..c {
        for (k, o) in out.iter_mut().enumerate() {
            *o += t[k * c + j];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pseudo-random terms with a wide spread of magnitudes, so any change of order shows.
    fn term(k: usize, j: usize) -> f32 {
        let h = ((k * 7919 + j * 104_729) as u32).wrapping_mul(2_654_435_761);
        let m = (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
        m * 2f32.powi((h % 23) as i32 - 11)
    }

    #[test]
    fn every_row_sums_in_index_order() {
        for c in [1, 15, 16, 17, 31, 48, 384, 1000] {
            for n in [1, 7, 16] {
                let got = row_sums(n, c, term);
                for (k, g) in got.iter().take(n).enumerate() {
                    let want: f32 = (0..c).map(|j| term(k, j)).sum();
                    assert_eq!(g.to_bits(), want.to_bits(), "c {c}, n {n}, row {k}");
                }
            }
        }
    }
}
