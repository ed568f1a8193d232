//! Packing for the AMX bf16 GEMM (`amx`): A's rows of one 32-row block row-major in k-pair
//! dwords (one tile row is 16 pairs, 64 bytes), B in panels of 16 columns whose k-pair rows are
//! 16 dwords (16 pair rows are one tile, 1 KiB contiguous), both zero past the matrix and past k
//! up to whole tiles. Row-major operands are copied or interleaved a vector at a time; a
//! transposed operand (the other dim contiguous) goes through 16 × 16 dword transposes in
//! AVX-512 registers; any other stride element by element.
//!
//! Not for: the tiles or the threads (`amx`).

use super::super::simd::transpose16;
use super::amx::{BLOCK, PANEL};
use super::pack::Strided;

/// Two bf16 bit patterns as one dword: `lo` (even k) in bits 0..16, `hi` (odd k) above.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// Rows `r0 .. r0 + 32` of A (m × k) into `dst`: row i's k-pairs at `i·pairs ..`, zero past k
/// and past m.
pub(super) fn pack_a_rows(
    a: Strided,
    m: usize,
    k: usize,
    r0: usize,
    pairs: usize,
    dst: &mut [u32],
) {
    let rows = BLOCK.min(m - r0);
    let full = k / 2;
    // Only the padding needs zeros: past the last row, and each row past its last whole pair
    // (an odd k's last pair is written with a zero high half below).
    dst[rows * pairs..].fill(0);
    for row in dst.chunks_mut(pairs).take(rows) {
        row[full..].fill(0);
    }
    if a.cs == 1 {
        // Row-major: each row's k is contiguous, already in pair order.
        let dst16: &mut [u16] = bytemuck::cast_slice_mut(dst);
        for i in 0..rows {
            let src = &a.data[a.off + (r0 + i) * a.rs..][..k];
            dst16[i * 2 * pairs..][..k].copy_from_slice(src);
        }
        return;
    }
    if a.rs == 1 {
        // Transposed: for each k the block's rows are contiguous. Whole 16-row × 16-pair
        // squares go through registers (`transposed_square`); the ragged rest pair by pair.
        let (sq_rows, sq_pairs) = (rows / 16 * 16, full / 16 * 16);
        for i0 in (0..sq_rows).step_by(16) {
            for p0 in (0..sq_pairs).step_by(16) {
                // SAFETY: AVX-512 is present (`supported`); rows i0..i0 + 16 < `rows` and k
                // up to 2·(p0 + 16) ≤ k exist in A, and dst holds 32 rows of `pairs` dwords.
                unsafe { transposed_square(a, r0 + i0, p0, &mut dst[i0 * pairs + p0..], pairs) };
            }
        }
        for p in 0..full {
            let lo = &a.data[a.off + r0 + 2 * p * a.cs..][..rows];
            let hi = &a.data[a.off + r0 + (2 * p + 1) * a.cs..][..rows];
            let from = if p < sq_pairs { sq_rows } else { 0 };
            for i in from..rows {
                dst[i * pairs + p] = pair(lo[i], hi[i]);
            }
        }
    } else {
        for i in 0..rows {
            for p in 0..full {
                dst[i * pairs + p] = pair(a.at(r0 + i, 2 * p), a.at(r0 + i, 2 * p + 1));
            }
        }
    }
    if k % 2 == 1 {
        for i in 0..rows {
            dst[i * pairs + full] = pair(a.at(r0 + i, k - 1), 0);
        }
    }
}

/// Rows `i0 .. i0 + 16` × pairs `p0 .. p0 + 16` of a transposed A (each k's rows contiguous)
/// into `dst` (row i's 16 pairs at `i·pairs`): 16 vectors of one pair per row, transposed as a
/// 16 × 16 dword matrix in registers (unpack 32- and 64-bit, then two 128-bit lane shuffles).
///
/// # Safety
/// AVX512F is present; A has rows `i0 .. i0 + 16` and k up to `2·p0 + 32`; `dst` holds 15 rows
/// of `pairs` dwords and 16 more.
#[target_feature(enable = "avx512f")]
unsafe fn transposed_square(a: Strided, i0: usize, p0: usize, dst: &mut [u32], pairs: usize) {
    use std::arch::x86_64::*;
    let zero = _mm512_setzero_si512();
    let mut r = [zero; 16];
    for (q, v) in r.iter_mut().enumerate() {
        let k = 2 * (p0 + q);
        let lo = &a.data[a.off + i0 + k * a.cs..][..16];
        let hi = &a.data[a.off + i0 + (k + 1) * a.cs..][..16];
        // SAFETY: AVX512F is present (the caller's contract); both slices hold 16 values.
        *v = unsafe { pairs16(lo, hi) };
    }
    let r = transpose16(r);
    for (i, row) in r.iter().enumerate() {
        let out = &mut dst[i * pairs..][..16];
        // SAFETY: `out` holds 16 dwords (64 bytes).
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), *row) };
    }
}

/// Two rows of 16 bf16 (`lo` at even k, `hi` at odd k) as 16 pair dwords.
///
/// # Safety
/// AVX512F is present; both slices hold at least 16 values.
#[target_feature(enable = "avx512f")]
unsafe fn pairs16(lo: &[u16], hi: &[u16]) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: both slices hold 16 u16 (32 bytes).
    let (lo, hi) = unsafe {
        (
            _mm256_loadu_si256(lo[..16].as_ptr().cast()),
            _mm256_loadu_si256(hi[..16].as_ptr().cast()),
        )
    };
    _mm512_or_si512(
        _mm512_cvtepu16_epi32(lo),
        _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)),
    )
}

/// Pairs `p0 .. p0 + 16` of columns `c0 .. c0 + 16` of a transposed B (each column's k
/// contiguous) into `dst` (pair row p's 16 columns at `p·16`): each column's 16 pairs are one
/// vector, transposed in registers.
///
/// # Safety
/// AVX512F is present; B has columns `c0 .. c0 + 16` and k up to `2·p0 + 32`.
#[target_feature(enable = "avx512f")]
unsafe fn transposed_b_square(b: Strided, c0: usize, p0: usize, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    let mut r = [_mm512_setzero_si512(); 16];
    for (c, v) in r.iter_mut().enumerate() {
        let col = &b.data[b.off + (c0 + c) * b.cs + 2 * p0..][..32];
        // SAFETY: `col` holds 32 u16 (64 bytes).
        *v = unsafe { _mm512_loadu_si512(col.as_ptr().cast()) };
    }
    let r = transpose16(r);
    for (p, row) in r.iter().enumerate() {
        // SAFETY: `dst` holds 16 rows of 16 dwords.
        unsafe { _mm512_storeu_si512(dst[p * PANEL..][..16].as_mut_ptr().cast(), *row) };
    }
}

/// Columns `c0 .. c0 + 16` of B (k × n) into `dst`: pair p, column c at `p·16 + c`, zero past
/// k and past n.
pub(super) fn pack_b(b: Strided, k: usize, n: usize, c0: usize, dst: &mut [u32]) {
    let cols = PANEL.min(n.saturating_sub(c0));
    let full = k / 2;
    // Only the padding needs zeros: the pairs past k, and a ragged panel's missing columns.
    if cols < PANEL {
        dst.fill(0);
    } else {
        dst[full * PANEL..].fill(0);
    }
    if cols == 0 {
        return;
    }
    if b.cs == 1 {
        // Row-major: two rows' 16 columns interleave into one run of pairs (one vector for a
        // whole panel).
        for p in 0..full {
            let lo = &b.data[b.off + 2 * p * b.rs + c0..][..cols];
            let hi = &b.data[b.off + (2 * p + 1) * b.rs + c0..][..cols];
            if cols == PANEL {
                // SAFETY: AVX512F is present (`supported`); both rows hold 16 values and the
                // panel's pair row 16 dwords.
                unsafe {
                    let v = pairs16(lo, hi);
                    std::arch::x86_64::_mm512_storeu_si512(dst[p * PANEL..].as_mut_ptr().cast(), v);
                }
            } else {
                for (c, (&l, &h)) in lo.iter().zip(hi).enumerate() {
                    dst[p * PANEL + c] = pair(l, h);
                }
            }
        }
    } else if b.rs == 1 {
        // Transposed: each column's k is contiguous, already in pair order; whole 16-pair ×
        // 16-column squares are transposed in registers, the rest pair by pair.
        let squares = if cols == PANEL { full / 16 } else { 0 };
        for q in 0..squares {
            // SAFETY: AVX512F is present; each column holds pairs 16q .. 16q + 16 (k ≥ 32q +
            // 32), and dst holds those 16 pair rows of 16 dwords.
            unsafe { transposed_b_square(b, c0, 16 * q, &mut dst[16 * q * PANEL..][..16 * PANEL]) };
        }
        for c in 0..cols {
            let col = &b.data[b.off + (c0 + c) * b.cs..][..2 * full];
            for (p, two) in col.chunks_exact(2).enumerate().skip(16 * squares) {
                dst[p * PANEL + c] = pair(two[0], two[1]);
            }
        }
    } else {
        for p in 0..full {
            for c in 0..cols {
                dst[p * PANEL + c] = pair(b.at(2 * p, c0 + c), b.at(2 * p + 1, c0 + c));
            }
        }
    }
    if k % 2 == 1 {
        for c in 0..cols {
            dst[full * PANEL + c] = pair(b.at(k - 1, c0 + c), 0);
        }
    }
}
