//! Packing for the native bf16 GEMM: strided bf16 operands copied once per call into the
//! "pair" layouts the micro-kernel reads with plain vector loads. One dword holds the bf16
//! values of two consecutive k (k = 2p in the low half, 2p + 1 in the high half), the operand
//! form of `VDPBF16PS`. An odd k leaves the last pair's high half zero, and rows or columns past
//! the matrix edge are zero, so the kernel always runs whole 6×64 tiles.
//!
//! - A (m × k) becomes slivers of `MR` rows, stored k block by k block: within the block of
//!   pairs `p0..p0 + np`, sliver s, pair p, row r is at `(s·np + p − p0)·MR + r`.
//! - B (k × n) becomes panels of `NR` columns, also k block by k block: within the block of
//!   pairs `p0..p0 + np`, panel j, pair p, column c is at `(j·np + p − p0)·NR + c`.
//!
//! A task's reads for one k block (its slivers; one panel) are therefore contiguous. Packing
//! runs in units of a group of slivers or panels for one k block; the packers are compiled for
//! AVX-512 (they run only where the native kernel does), so the interleaves use zmm.
//!
//! Each operand has a fast path for unit stride along k or along its other dim (row-major and
//! transposed tensors); any other stride (broadcasts, narrowed views) goes element by element.
//!
//! Not for: arithmetic or threads.

use super::super::simd::transpose16;
use super::{MR, NR};
use std::arch::x86_64::*;
use std::ops::Range;

/// A strided matrix view over bf16 bits: element (i, j) is `data[off + i·rs + j·cs]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Strided<'a> {
    pub data: &'a [u16],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

impl Strided<'_> {
    pub(super) fn at(&self, i: usize, j: usize) -> u16 {
        self.data[self.off + i * self.rs + j * self.cs]
    }
}

/// Slivers (or panels) per packing unit: 96 rows, three cache lines of a transposed A per k;
/// 1024 columns, 2 KiB of a row-major B row.
pub(super) const PACK_GROUP: usize = 16;
/// How many k-pairs ahead the transposed packers prefetch.
const AHEAD: usize = 8;

/// Asks for the cache line holding `x` (a hint: no fault, no effect on results).
#[inline(always)]
pub(super) fn prefetch(x: &u16) {
    // SAFETY: PREFETCHT0 only hints the cache; any address is allowed, and `x` is a live
    // reference besides.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const u16).cast(),
        )
    }
}

/// Two bf16 bit patterns as one dword: `lo` (even k) in bits 0..16, `hi` (odd k) above.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// Packs pairs `ps` of consecutive slivers of `a` (m × k), the first being sliver `s0`, into
/// `dst`: one `ps.len()·MR`-dword run per sliver, as many slivers as `dst` holds.
///
/// # Safety
/// The CPU supports AVX512F and AVX512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn pack_a(
    a: Strided,
    m: usize,
    k: usize,
    s0: usize,
    ps: Range<usize>,
    dst: &mut [u32],
) {
    let run = ps.len() * MR;
    if a.rs == 1 && a.cs != 1 {
        transposed_a(a, m, k, s0, ps, dst);
    } else {
        for (g, out) in dst.chunks_mut(run).enumerate() {
            sliver_a(a, m, k, s0 + g, ps.clone(), out);
        }
    }
}

/// A transposed (column-major) A: each k is one contiguous run of rows, so the whole group of
/// slivers is filled k-pair by k-pair and every cache line read is used whole (packing sliver
/// by sliver would read 12 bytes of each line).
#[target_feature(enable = "avx512f,avx512bw")]
fn transposed_a(a: Strided, m: usize, k: usize, s0: usize, ps: Range<usize>, dst: &mut [u32]) {
    let np = ps.len();
    let count = dst.len() / (np * MR);
    let (r0, r1) = (s0 * MR, ((s0 + count) * MR).min(m));
    if r1 - r0 < count * MR {
        dst[(count - 1) * np * MR..].fill(0);
    }
    let end = ps.end;
    let mut run = [0u32; PACK_GROUP * MR];
    for (i, p) in ps.enumerate() {
        // The k rows are far apart: prefetch the pair AHEAD pairs on.
        if p + AHEAD < end && 2 * (p + AHEAD) + 1 < k {
            for kk in [2 * (p + AHEAD), 2 * (p + AHEAD) + 1] {
                for at in (0..r1 - r0).step_by(32) {
                    prefetch(&a.data[a.off + kk * a.cs + r0 + at]);
                }
            }
        }
        // Interleave the two k rows of the whole group at once (wide vectors), then hand each
        // sliver its 6 dwords.
        let lo = &a.data[a.off + 2 * p * a.cs + r0..][..r1 - r0];
        let both = &mut run[..r1 - r0];
        if 2 * p + 1 < k {
            let hi = &a.data[a.off + (2 * p + 1) * a.cs + r0..][..r1 - r0];
            for ((o, &l), &h) in both.iter_mut().zip(lo).zip(hi) {
                *o = pair(l, h);
            }
        } else {
            for (o, &l) in both.iter_mut().zip(lo) {
                *o = pair(l, 0);
            }
        }
        spread_slivers(both, dst, np * MR, i * MR);
    }
}

/// Spreads the dwords of one k (or k-pair) of a group of slivers, `run` (`MR` per sliver,
/// fewer for a ragged last one), into the slivers' packed runs: sliver g's at
/// `dst[g·stride + at..]`. Whole slivers are fixed-size copies: with the length known only at
/// run time LLVM made each 24-byte copy a `memmove` call (3 % of a bf16 training step).
#[inline(always)]
pub(super) fn spread_slivers(run: &[u32], dst: &mut [u32], stride: usize, at: usize) {
    let whole = run.chunks_exact(MR);
    let (rest, count) = (whole.remainder(), whole.len());
    for (g, six) in whole.enumerate() {
        let to: &mut [u32; MR] = (&mut dst[g * stride + at..][..MR])
            .try_into()
            .expect("MR dwords");
        *to = six.try_into().expect("chunks_exact gives MR dwords");
    }
    if !rest.is_empty() {
        dst[count * stride + at..][..rest.len()].copy_from_slice(rest);
    }
}

/// One sliver of a row-major (or arbitrarily strided) A.
#[target_feature(enable = "avx512f,avx512bw")]
fn sliver_a(a: Strided, m: usize, k: usize, s: usize, ps: Range<usize>, dst: &mut [u32]) {
    let (r0, rows) = (s * MR, MR.min(m - s * MR));
    if rows < MR {
        dst.fill(0);
    }
    // The k range of these pairs: k0..k1, of which the last may be a half pair.
    let (k0, k1) = (2 * ps.start, (2 * ps.end).min(k));
    if a.cs == 1 {
        // Row-major rows: read the sliver's rows side by side and write the pairs in order.
        // The rows' pieces are short (one k block) and far apart, so the next sliver's are
        // prefetched: hardware prefetchers do not start on such short strided runs in time.
        let len = k1 - k0;
        let row = |r: usize| a.off + (r0 + r) * a.rs + k0;
        if r0 + 2 * MR <= m {
            for r in MR..2 * MR {
                for at in (0..len).step_by(32) {
                    prefetch(&a.data[row(r) + at]);
                }
            }
        }
        let mut src: [&[u16]; MR] = [&[]; MR];
        for (r, src) in src.iter_mut().enumerate().take(rows) {
            *src = &a.data[row(r)..row(r) + len];
        }
        for (p, out) in dst.chunks_exact_mut(MR).take(len / 2).enumerate() {
            for (o, src) in out.iter_mut().zip(&src).take(rows) {
                *o = pair(src[2 * p], src[2 * p + 1]);
            }
        }
        if len % 2 == 1 {
            for (r, src) in src.iter().enumerate().take(rows) {
                dst[len / 2 * MR + r] = pair(src[len - 1], 0);
            }
        }
    } else {
        for (i, p) in ps.enumerate() {
            for r in 0..rows {
                let hi = if 2 * p + 1 < k {
                    a.at(r0 + r, 2 * p + 1)
                } else {
                    0
                };
                dst[i * MR + r] = pair(a.at(r0 + r, 2 * p), hi);
            }
        }
    }
}

/// Packs pairs `ps` of consecutive panels of `b` (k × n), the first being panel `j0`, into
/// `dst`: one `ps.len()·NR`-dword run per panel, as many panels as `dst` holds.
///
/// # Safety
/// The CPU supports AVX512F and AVX512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn pack_b(
    b: Strided,
    k: usize,
    n: usize,
    j0: usize,
    ps: Range<usize>,
    dst: &mut [u32],
) {
    let np = ps.len();
    let count = dst.len() / (np * NR);
    let (c0, c1) = (j0 * NR, ((j0 + count) * NR).min(n));
    if c1 - c0 < count * NR {
        dst[(count - 1) * np * NR..].fill(0);
    }
    if b.cs == 1 {
        // Row-major (k × n): interleave two source rows, reading each once, in full.
        for (i, p) in ps.enumerate() {
            let lo = &b.data[b.off + 2 * p * b.rs + c0..][..c1 - c0];
            let hi = (2 * p + 1 < k).then(|| &b.data[b.off + (2 * p + 1) * b.rs + c0..][..c1 - c0]);
            for (g, lo) in lo.chunks(NR).enumerate() {
                let out = &mut dst[(g * np + i) * NR..][..lo.len()];
                match hi {
                    Some(hi) => {
                        for ((o, &l), &h) in out.iter_mut().zip(lo).zip(&hi[g * NR..]) {
                            *o = pair(l, h);
                        }
                    }
                    None => {
                        for (o, &l) in out.iter_mut().zip(lo) {
                            *o = pair(l, 0);
                        }
                    }
                }
            }
        }
    } else if b.rs == 1 {
        transposed_b(b, k, c0..c1, ps, dst);
    } else {
        for (i, p) in ps.enumerate() {
            for c in c0..c1 {
                let (g, cc) = ((c - c0) / NR, (c - c0) % NR);
                let hi = if 2 * p + 1 < k { b.at(2 * p + 1, c) } else { 0 };
                dst[(g * np + i) * NR + cc] = pair(b.at(2 * p, c), hi);
            }
        }
    }
}

/// A transposed B (a weight read as Wᵀ): each column is contiguous along k, so 16 columns ×
/// 16 pairs are loaded as 16 zmm (one per column) and transposed in registers into 16 rows of
/// the panel; the ragged edges go pair by pair.
#[target_feature(enable = "avx512f,avx512bw")]
fn transposed_b(b: Strided, k: usize, cs: Range<usize>, ps: Range<usize>, dst: &mut [u32]) {
    let np = ps.len();
    let (k0, k1) = (2 * ps.start, (2 * ps.end).min(k));
    let col = |c: usize| &b.data[b.off + c * b.cs + k0..][..k1 - k0];
    let full_pairs = (k1 - k0) / 2 / 16 * 16;
    let mut c = cs.start;
    while c < cs.end {
        let (g, cc) = ((c - cs.start) / NR, (c - cs.start) % NR);
        let out = &mut dst[g * np * NR..][..np * NR];
        if cc + 16 <= NR && c + 16 <= cs.end {
            let cols: [&[u16]; 16] = std::array::from_fn(|x| col(c + x));
            for i in (0..full_pairs).step_by(16) {
                let rows: [__m512i; 16] = std::array::from_fn(|x| {
                    let run = &cols[x][2 * i..2 * i + 32];
                    // SAFETY: `run` holds 32 bf16 = 64 readable bytes.
                    unsafe { _mm512_loadu_epi32(run.as_ptr().cast()) }
                });
                for (ii, row) in transpose16(rows).into_iter().enumerate() {
                    let to = &mut out[(i + ii) * NR + cc..][..16];
                    // SAFETY: `to` holds 16 writable dwords.
                    unsafe { _mm512_storeu_epi32(to.as_mut_ptr().cast(), row) };
                }
            }
            for (x, src) in cols.iter().enumerate() {
                column_b(&src[2 * full_pairs..], &mut out[full_pairs * NR..], cc + x);
            }
            c += 16;
        } else {
            column_b(col(c), out, cc);
            c += 1;
        }
    }
}

/// One column's pairs (`src`, contiguous along k) into column `cc` of a panel run.
fn column_b(src: &[u16], out: &mut [u32], cc: usize) {
    for (i, two) in src.chunks_exact(2).enumerate() {
        out[i * NR + cc] = pair(two[0], two[1]);
    }
    if src.len() % 2 == 1 {
        out[src.len() / 2 * NR + cc] = pair(src[src.len() - 1], 0);
    }
}
