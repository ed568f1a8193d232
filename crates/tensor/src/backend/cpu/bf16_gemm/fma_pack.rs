//! Packing for the FMA flavor of the bf16 GEMM (`flavor::FmaBf16`): strided bf16 operands
//! copied once per call as f32 into the layouts of the f32 micro-kernel, one k per dword (a
//! bf16 widens exactly: its bits are the high half of the f32). The layouts are those
//! of `pack` with one k in place of a k-pair:
//!
//! - A (m × k): slivers of `MR` rows, k block by k block: within the block of k `u0..u0 + nu`,
//!   sliver s, k u, row r is at `(s·nu + u − u0)·MR + r`.
//! - B (k × n): panels of `NR` columns: panel j, k u, column c at `(j·nu + u − u0)·NR + c`.
//!
//! Rows and columns past the matrix edge are zero, so the kernel runs whole 6×64 tiles. Each
//! operand has a fast path for unit stride along either dim (row-major and transposed
//! tensors); any other stride (broadcasts, narrowed views) goes element by element.
//!
//! Not for: arithmetic or threads.

use super::super::simd::transpose16;
use super::pack::{Strided, prefetch, spread_slivers};
use super::{MR, NR};
use std::arch::x86_64::*;
use std::ops::Range;

/// How many k ahead the transposed packer prefetches.
const AHEAD: usize = 16;

/// bf16 bits as the bits of the f32 of the same value (its high half).
#[inline(always)]
fn widen(x: u16) -> u32 {
    (x as u32) << 16
}

/// Packs k `us` of consecutive slivers of `a` (m × k), the first being sliver `s0`, into
/// `dst`: one `us.len()·MR`-dword run per sliver, as many slivers as `dst` holds.
///
/// # Safety
/// The CPU supports AVX512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_a(
    a: Strided,
    m: usize,
    _k: usize,
    s0: usize,
    us: Range<usize>,
    dst: &mut [u32],
) {
    let nu = us.len();
    if a.rs == 1 && a.cs != 1 {
        transposed_a(a, m, s0, us, dst);
        return;
    }
    for (g, out) in dst.chunks_mut(nu * MR).enumerate() {
        let r0 = (s0 + g) * MR;
        let rows = MR.min(m - r0);
        if rows < MR {
            out.fill(0);
        }
        if a.cs == 1 {
            // Row-major A: each row's piece of k is contiguous.
            let src: [&[u16]; MR] = std::array::from_fn(|r| {
                let r = r.min(rows - 1);
                &a.data[a.off + (r0 + r) * a.rs + us.start..][..nu]
            });
            let mut i = 0;
            if rows == MR {
                while i + 16 <= nu {
                    interleave_16(&src, i, &mut out[i * MR..][..16 * MR]);
                    i += 16;
                }
            }
            for (r, row) in src.iter().enumerate().take(rows) {
                for (ii, &v) in row.iter().enumerate().skip(i) {
                    out[ii * MR + r] = widen(v);
                }
            }
        } else {
            for (i, u) in us.clone().enumerate() {
                for r in 0..rows {
                    out[i * MR + r] = widen(a.at(r0 + r, u));
                }
            }
        }
    }
}

/// Where the 16 k of the sliver's 6 rows go among the 96 packed dwords `(k, row)`: output
/// vector j, lane l holds position `16j + l`, that is k `(16j + l) / 6` of row `(16j + l) % 6`.
/// `MASK[j][r]` marks the lanes of vector j taken from row r, `INDEX[j][r]` their k.
struct Spread {
    mask: [[u16; MR]; MR],
    index: [[[i32; 16]; MR]; MR],
}

const SPREAD: Spread = spread();

const fn spread() -> Spread {
    let mut s = Spread {
        mask: [[0; MR]; MR],
        index: [[[0; 16]; MR]; MR],
    };
    let mut j = 0;
    while j < MR {
        let mut l = 0;
        while l < 16 {
            let at = 16 * j + l;
            let (k, r) = (at / MR, at % MR);
            s.mask[j][r] |= 1 << l;
            s.index[j][r][l] = k as i32;
            l += 1;
        }
        j += 1;
    }
    s
}

/// k `i..i + 16` of the 6 rows `src`, widened, into the 96 dwords `out` in `(k, row)` order:
/// 6 vector loads, and per output vector one masked permute from each row.
#[target_feature(enable = "avx512f")]
fn interleave_16(src: &[&[u16]; MR], i: usize, out: &mut [u32]) {
    let rows: [__m512i; MR] = std::array::from_fn(|r| {
        let run = &src[r][i..i + 16];
        // SAFETY: `run` holds 16 bf16 = 32 readable bytes.
        let h = unsafe { _mm256_loadu_si256(run.as_ptr().cast()) };
        _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))
    });
    for (j, to) in out.chunks_exact_mut(16).enumerate() {
        let mut v = _mm512_setzero_si512();
        for (r, &row) in rows.iter().enumerate() {
            // SAFETY: the table row holds 16 i32 = 64 readable bytes.
            let index = unsafe { _mm512_loadu_epi32(SPREAD.index[j][r].as_ptr()) };
            v = _mm512_mask_permutexvar_epi32(v, SPREAD.mask[j][r], index, row);
        }
        // SAFETY: `to` holds 16 writable dwords.
        unsafe { _mm512_storeu_epi32(to.as_mut_ptr().cast(), v) };
    }
}

/// A transposed (column-major) A: each k is one contiguous run of rows, so the whole group of
/// slivers is widened k by k in full vectors, and each sliver takes its 6 dwords.
#[target_feature(enable = "avx512f")]
fn transposed_a(a: Strided, m: usize, s0: usize, us: Range<usize>, dst: &mut [u32]) {
    let nu = us.len();
    let count = dst.len() / (nu * MR);
    let (r0, r1) = (s0 * MR, ((s0 + count) * MR).min(m));
    if r1 - r0 < count * MR {
        dst[(count - 1) * nu * MR..].fill(0);
    }
    let mut run = [0u32; super::pack::PACK_GROUP * MR];
    let end = us.end;
    for (i, u) in us.enumerate() {
        // The k runs are far apart: prefetch the one AHEAD k on.
        if u + AHEAD < end {
            let next = a.off + (u + AHEAD) * a.cs + r0;
            for at in (0..r1 - r0).step_by(32) {
                prefetch(&a.data[next + at]);
            }
        }
        let col = &a.data[a.off + u * a.cs + r0..][..r1 - r0];
        let wide = &mut run[..r1 - r0];
        for (o, &v) in wide.iter_mut().zip(col) {
            *o = widen(v);
        }
        spread_slivers(wide, dst, nu * MR, i * MR);
    }
}

/// Packs k `us` of consecutive panels of `b` (k × n), the first being panel `j0`, into `dst`:
/// one `us.len()·NR`-dword run per panel, as many panels as `dst` holds.
///
/// # Safety
/// The CPU supports AVX512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_b(
    b: Strided,
    _k: usize,
    n: usize,
    j0: usize,
    us: Range<usize>,
    dst: &mut [u32],
) {
    let nu = us.len();
    let count = dst.len() / (nu * NR);
    let (c0, c1) = (j0 * NR, ((j0 + count) * NR).min(n));
    if c1 - c0 < count * NR {
        dst[(count - 1) * nu * NR..].fill(0);
    }
    if b.cs == 1 {
        // Row-major (k × n): each k row is contiguous across the panels.
        for (i, u) in us.enumerate() {
            let row = &b.data[b.off + u * b.rs + c0..][..c1 - c0];
            for (g, piece) in row.chunks(NR).enumerate() {
                let out = &mut dst[(g * nu + i) * NR..][..piece.len()];
                for (o, &v) in out.iter_mut().zip(piece) {
                    *o = widen(v);
                }
            }
        }
    } else if b.rs == 1 {
        transposed_b(b, c0..c1, us, dst);
    } else {
        for (i, u) in us.enumerate() {
            for c in c0..c1 {
                let (g, cc) = ((c - c0) / NR, (c - c0) % NR);
                dst[(g * nu + i) * NR + cc] = widen(b.at(u, c));
            }
        }
    }
}

/// A transposed B (a weight read as Wᵀ): each column is contiguous along k, so 16 columns ×
/// 16 k are widened into 16 zmm (one per column) and transposed in registers into 16 rows of
/// the panel; the ragged edges go element by element.
#[target_feature(enable = "avx512f")]
fn transposed_b(b: Strided, cs: Range<usize>, us: Range<usize>, dst: &mut [u32]) {
    let nu = us.len();
    let col = |c: usize| &b.data[b.off + c * b.cs + us.start..][..nu];
    let full = nu / 16 * 16;
    let mut c = cs.start;
    while c < cs.end {
        let (g, cc) = ((c - cs.start) / NR, (c - cs.start) % NR);
        let out = &mut dst[g * nu * NR..][..nu * NR];
        if cc + 16 <= NR && c + 16 <= cs.end {
            let cols: [&[u16]; 16] = std::array::from_fn(|x| col(c + x));
            for i in (0..full).step_by(16) {
                let rows: [__m512i; 16] = std::array::from_fn(|x| {
                    let run = &cols[x][i..i + 16];
                    // SAFETY: `run` holds 16 bf16 = 32 readable bytes.
                    let h = unsafe { _mm256_loadu_si256(run.as_ptr().cast()) };
                    _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))
                });
                for (ii, row) in transpose16(rows).into_iter().enumerate() {
                    let to = &mut out[(i + ii) * NR + cc..][..16];
                    // SAFETY: `to` holds 16 writable dwords.
                    unsafe { _mm512_storeu_epi32(to.as_mut_ptr().cast(), row) };
                }
            }
            for (x, src) in cols.iter().enumerate() {
                for (i, &v) in src.iter().enumerate().skip(full) {
                    out[i * NR + cc + x] = widen(v);
                }
            }
            c += 16;
        } else {
            for (i, &v) in col(c).iter().enumerate() {
                out[i * NR + cc] = widen(v);
            }
            c += 1;
        }
    }
}
