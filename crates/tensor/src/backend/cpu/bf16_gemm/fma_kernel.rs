//! The register-blocked micro-kernel of the FMA flavor of the bf16 GEMM (`flavor::FmaBf16`):
//! a 6×64 block of C in 24 zmm f32 accumulators. Per k it loads the 64 columns of a packed B
//! row (4 zmm), broadcasts each of the 6 packed A values and issues 24 `VFMADD231PS`, each one
//! fused multiply-add per lane, rounded once (IEEE 754 fusedMultiplyAdd). Two FMA ports of
//! 4-cycle latency need 8 independent chains; 24 keep both busy with registers left for the B
//! row (the BLIS micro-kernel scheme: Van Zee & van de Geijn, 2015).
//!
//! Each f32 sum is rounded once to bf16 as `Elem::from_f32` rounds (round-to-nearest-even on
//! the bits, subnormals kept, a NaN quieted), in integer AVX-512F steps, so the kernel needs no
//! AVX512_BF16.
//!
//! Not for: packing (`fma_pack`) or blocking and threads (`driver`). The caller guarantees the
//! CPU features; this file only computes.

use super::kernel::Store;
use super::{MR, NR};
use std::arch::x86_64::*;

/// `C[6×64] (+)= Σ_u A[u] · B[u]` over `units` packed f32 units, each sum of the last k
/// block rounded once to bf16 by [`round_bf16`].
///
/// # Safety
/// - The CPU supports AVX512F, AVX512BW and AVX512VL.
/// - `a` points at `units·MR` readable dwords (sliver layout of `fma_pack::pack_a`) and `b`
///   at `units·NR` (panel layout of `fma_pack::pack_b`).
/// - `load`, when given, points at `MR·NR` readable f32 (row stride `NR`).
/// - `store` is writable: `MR·NR` f32 for `Tile`; for `Out`, `rows ≤ MR` rows of `cols ≤ NR`
///   bf16 at stride `ld`, not overlapping anything another thread touches.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn tile_bf16(
    units: usize,
    a: *const u32,
    b: *const u32,
    load: Option<*const f32>,
    store: Store,
) {
    let mut c = [[_mm512_setzero_ps(); 4]; MR];
    if let Some(t) = load {
        for (r, row) in c.iter_mut().enumerate() {
            for (q, acc) in row.iter_mut().enumerate() {
                // SAFETY: `t` holds MR·NR f32 (contract); r·NR + q·16 + 16 ≤ MR·NR.
                *acc = unsafe { _mm512_loadu_ps(t.add(r * NR + q * 16)) };
            }
        }
    }
    for u in 0..units {
        // SAFETY: u < units, so the NR dwords at b + u·NR and the MR at a + u·MR lie inside
        // the packed panel and sliver (contract); they hold f32 bits.
        unsafe {
            let bp = b.add(u * NR) as *const f32;
            let bv = [
                _mm512_loadu_ps(bp),
                _mm512_loadu_ps(bp.add(16)),
                _mm512_loadu_ps(bp.add(32)),
                _mm512_loadu_ps(bp.add(48)),
            ];
            let ap = a.add(u * MR) as *const f32;
            for (r, row) in c.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*ap.add(r));
                for (acc, &bq) in row.iter_mut().zip(&bv) {
                    *acc = _mm512_fmadd_ps(av, bq, *acc);
                }
            }
        }
    }
    match store {
        Store::Tile(t) => {
            for (r, row) in c.iter().enumerate() {
                for (q, acc) in row.iter().enumerate() {
                    // SAFETY: `t` holds MR·NR writable f32 (contract).
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
            // The sums go through memory once, so that rounding (a dozen vector steps each)
            // does not keep the accumulators from living in registers during the loop.
            let mut sums = [0f32; MR * NR];
            for (r, row) in c.iter().enumerate() {
                for (q, acc) in row.iter().enumerate() {
                    // SAFETY: `sums` holds MR·NR f32.
                    unsafe { _mm512_storeu_ps(sums[r * NR + q * 16..].as_mut_ptr(), *acc) };
                }
            }
            for (r, row) in sums.chunks_exact(NR).enumerate().take(rows) {
                for (q, sixteen) in row.chunks_exact(16).enumerate() {
                    let first = q * 16;
                    if first >= cols {
                        break;
                    }
                    let mask = if cols - first >= 16 {
                        0xFFFF
                    } else {
                        ((1u32 << (cols - first)) - 1) as u16
                    };
                    // SAFETY: AVX512F is present (contract); `sixteen` holds 16 f32; the
                    // masked store writes only columns first..min(cols, first + 16) of row
                    // r < rows of the caller's block (contract).
                    unsafe {
                        let h = round_bf16(_mm512_loadu_ps(sixteen.as_ptr()));
                        _mm256_mask_storeu_epi16(ptr.add(r * ld + first).cast(), mask, h)
                    };
                }
            }
        }
    }
}

/// 16 f32 rounded to bf16 bits by `Elem::from_f32`'s rule: add 0x7FFF plus the kept half's
/// lowest bit and drop the low half (round-to-nearest-even, subnormals included); a NaN keeps
/// its high half with the quiet bit set.
///
/// # Safety
/// The CPU supports AVX512F (the function is inlined into its AVX-512 callers, so that the
/// accumulators it rounds stay in registers).
#[inline(always)]
unsafe fn round_bf16(v: __m512) -> __m256i {
    // SAFETY: the caller guarantees AVX512F.
    unsafe {
        let x = _mm512_castps_si512(v);
        let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
        let nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
        let high = _mm512_srli_epi32::<16>(x);
        let lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(
            x,
            _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb),
        ));
        let quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x0040));
        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet))
    }
}
