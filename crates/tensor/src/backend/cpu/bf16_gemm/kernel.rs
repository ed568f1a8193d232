//! The register-blocked micro-kernel of the native bf16 GEMM: a 6×64 block of C held in 24 zmm
//! f32 accumulators, fed by `VDPBF16PS` (`_mm512_dpbf16_ps`). Per k-pair it loads the 64
//! columns of a packed B row-pair (4 zmm), broadcasts each of the 6 packed A pairs (one dword
//! each) and issues 24 dot-products, each adding two bf16 products into an f32 lane. Intel's
//! intrinsics guide and SDM (`VDPBF16PS`: per lane `acc += a.hi·b.hi; acc += a.lo·b.lo`, each a
//! fused f32 step with round-to-nearest-even, denormal inputs and outputs flushed to zero)
//! describe the semantics; 24 accumulators cover the instruction's 6-cycle latency at Zen 5's two
//! issues per cycle (AIDA64 timings in the public InstLatX64 dumps; `docs/sources.md` §17) with
//! registers to spare for the B loads.
//!
//! A's pairs come through a [`Sliver`]: six row pointers and a step between pairs. A packed
//! sliver (`pack::pack_a`) has its rows one dword apart and pairs `MR` dwords apart; a
//! row-major A with even k is read where it lies (rows `lda` elements apart, pairs one dword
//! apart), since two consecutive bf16 of a row are already the pair `VDPBF16PS` broadcasts. The
//! sums are the same either way.
//!
//! Not for: packing (see `pack`) or blocking and threads (the parent module). The caller
//! guarantees the CPU features; this file only computes.

use super::{MR, NR};
use std::arch::x86_64::*;

/// Where a micro-tile's A pairs are: pair p of row r is the dword (two bf16, or one f32 for the
/// FMA flavor) at byte `rows[r] + p·step`, possibly unaligned.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sliver {
    pub rows: [*const u8; MR],
    pub step: usize,
}

impl Sliver {
    /// A packed sliver starting at `a`: row r at dword r, pairs `MR` dwords apart.
    pub(super) fn packed(a: *const u32) -> Sliver {
        Sliver {
            rows: std::array::from_fn(|r| a.wrapping_add(r).cast::<u8>()),
            step: MR * 4,
        }
    }

    /// The start of a packed sliver, if this is one (see [`Sliver::packed`]).
    pub(super) fn packed_start(&self) -> Option<*const u32> {
        let a = self.rows[0].cast::<u32>();
        (self.step == MR * 4 && self.rows == Sliver::packed(a).rows).then_some(a)
    }
}

/// Where a micro-tile's f32 sums go after one k block.
#[derive(Debug, Clone, Copy)]
pub(super) enum Store {
    /// More k blocks follow: all MR×NR sums go to an accumulator tile (row stride `NR`).
    Tile(*mut f32),
    /// The last k block: round each sum once to bf16 (here by `VCVTNEPS2BF16`,
    /// round-to-nearest-even) and write the `rows`×`cols` corner that lies inside C, row stride
    /// `ld` elements.
    Out {
        ptr: *mut u16,
        ld: usize,
        rows: usize,
        cols: usize,
    },
}

/// `C[6×64] (+)= Σ_p A_pair[p] · B_pair[p]` over `pairs` packed k-pairs.
///
/// # Safety
/// - The CPU supports AVX512F, AVX512BW, AVX512VL and AVX512_BF16.
/// - For every row r < MR and pair p < pairs, the 4 bytes at `a.rows[r] + p·a.step` are
///   readable (a packed sliver of `pack::pack_a`, or rows of A in place); `b` points at
///   `pairs·NR` readable dwords (panel layout of `pack::pack_b`).
/// - `load`, when given, points at `MR·NR` readable f32 (row stride `NR`): the sums of the
///   earlier k blocks.
/// - `store` is writable: `MR·NR` f32 for `Tile`; for `Out`, `rows ≤ MR` rows of `cols ≤ NR`
///   bf16 at stride `ld`, not overlapping anything another thread touches.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn tile_6x64(
    pairs: usize,
    a: Sliver,
    b: *const u32,
    load: Option<*const f32>,
    store: Store,
) {
    let mut c = [[_mm512_setzero_ps(); 4]; MR];
    if let Some(t) = load {
        for (r, row) in c.iter_mut().enumerate() {
            for (q, acc) in row.iter_mut().enumerate() {
                // SAFETY: `t` holds MR·NR f32 (contract above); r·NR + q·16 + 16 ≤ MR·NR.
                *acc = unsafe { _mm512_loadu_ps(t.add(r * NR + q * 16)) };
            }
        }
    }
    for p in 0..pairs {
        // SAFETY: p < pairs, so the NR dwords at b + p·NR are inside the packed panel and the
        // dword of each row r at a.rows[r] + p·a.step is readable (contract above; read
        // unaligned). `__m512i` and `__m512bh` are both 64-byte plain vectors, so the
        // transmutes only relabel the lanes as bf16 pairs.
        unsafe {
            let bp = b.add(p * NR) as *const i32;
            let bv: [__m512bh; 4] = [
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_epi32(bp)),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_epi32(bp.add(16))),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_epi32(bp.add(32))),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_epi32(bp.add(48))),
            ];
            for (r, row) in c.iter_mut().enumerate() {
                let pair = a.rows[r].add(p * a.step).cast::<i32>().read_unaligned();
                let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
                for (acc, &bq) in row.iter_mut().zip(&bv) {
                    *acc = _mm512_dpbf16_ps(*acc, av, bq);
                }
            }
        }
    }
    match store {
        Store::Tile(t) => {
            for (r, row) in c.iter().enumerate() {
                for (q, acc) in row.iter().enumerate() {
                    // SAFETY: `t` holds MR·NR writable f32 (contract above).
                    unsafe { _mm512_storeu_ps(t.add(r * NR + q * 16), *acc) };
                }
            }
        }
        Store::Out {
            ptr,
            ld,
            rows,
            cols,
        } => {
            for (r, row) in c.iter().enumerate().take(rows) {
                for (q, acc) in row.iter().enumerate() {
                    let first = q * 16;
                    if first >= cols {
                        break;
                    }
                    let mask = if cols - first >= 16 {
                        0xFFFF
                    } else {
                        ((1u32 << (cols - first)) - 1) as u16
                    };
                    // SAFETY: the masked store writes only columns first..min(cols, first+16)
                    // of row r < rows, inside the block the caller owns (contract above); the
                    // transmute relabels 16 bf16 lanes as 16 i16 lanes of the same 32 bytes.
                    unsafe {
                        let h = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(*acc));
                        _mm256_mask_storeu_epi16(ptr.add(r * ld + first) as *mut i16, mask, h);
                    }
                }
            }
        }
    }
}
