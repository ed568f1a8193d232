//! The AMX kernel's store (`amx`): one row of a 32 × 32 block of f32 sums rounded into bf16 C
//! (`VCVTNEPS2BF16`), and, for a linear layer, its bias added as a separate add op would add
//! it — the rounded product widened, the bias added in f32, the sum rounded by `Elem::from_f32`'s
//! rule — so the fused op keeps the bits of matmul followed by add.
//!
//! Not for: the tiles or the packing (`amx`, `amx_pack`).

use super::amx::BLOCK;

/// Rounds the first `cols` (≤ 32) of one row of f32 sums to bf16 at `dst`
/// (`VCVTNEPS2BF16`: round-to-nearest-even, like `half`'s conversion, but subnormal results
/// flushed to zero, as the native kernel's store does). With `bias` (the block's 32 bias values,
/// widened), then adds it as the add op does: the rounded product widened (exactly: a
/// `VCVTNEPS2BF16` result is never a signalling NaN), the bias added in f32, and the sum
/// rounded as `Elem::from_f32` rounds (`narrow`), so the stored bits are those of the product
/// followed by the add.
///
/// # Safety
/// AVX512F/BW/VL and AVX512_BF16 are present; `dst` is valid for `cols` u16 writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn round_row(
    row: &[f32],
    dst: *mut u16,
    cols: usize,
    bias: Option<&[f32; BLOCK]>,
) {
    use std::arch::x86_64::*;
    let row: &[f32; BLOCK] = row.try_into().expect("a row of 32 sums");
    // SAFETY: `row` holds 32 f32 (two vectors of 16).
    let (lo, hi) = unsafe {
        (
            _mm512_loadu_ps(row.as_ptr()),
            _mm512_loadu_ps(row[16..].as_ptr()),
        )
    };
    let round = |v: __m512| bits(_mm512_cvtneps_pbh(v));
    let (mut l, mut h) = (round(lo), round(hi));
    if let Some(bias) = bias {
        let widen =
            |h: __m256i| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
        // SAFETY: `bias` holds 32 f32.
        let (bl, bh) = unsafe {
            (
                _mm512_loadu_ps(bias.as_ptr()),
                _mm512_loadu_ps(bias[16..].as_ptr()),
            )
        };
        l = narrow(_mm512_add_ps(widen(l), bl));
        h = narrow(_mm512_add_ps(widen(h), bh));
    }
    let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(l), h);
    let mask = if cols >= BLOCK {
        u32::MAX
    } else {
        (1u32 << cols) - 1
    };
    // SAFETY: `dst` is valid for `cols` u16 writes and the mask writes only those.
    unsafe { _mm512_mask_storeu_epi16(dst.cast(), mask, both) };
}

/// The 16 bf16 of a vector as their bit patterns.
#[inline(always)]
fn bits(v: std::arch::x86_64::__m256bh) -> std::arch::x86_64::__m256i {
    // SAFETY: both are 256-bit vectors of plain bits; every pattern is valid for either.
    unsafe { std::mem::transmute(v) }
}

/// 16 f32 rounded to bf16 bits as `Elem::from_f32` rounds them: by `VCVTNEPS2BF16`, which
/// rounds normal values the same way (to nearest even), with the lanes it treats otherwise —
/// f32 subnormals (which it flushes) and NaNs — redone by `Elem::from_f32`'s integer rule (add
/// 0x7FFF plus the kept part's lowest bit and drop the low half; a NaN keeps its high half with
/// the quiet bit set). Such lanes are rare, so the integer rule runs only when one is present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
fn narrow(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let fast = bits(_mm512_cvtneps_pbh(v));
    let x = _mm512_castps_si512(v);
    let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
    let subnormal = _mm512_mask_cmplt_epu32_mask(
        _mm512_test_epi32_mask(abs, abs),
        abs,
        _mm512_set1_epi32(0x0080_0000),
    );
    let nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
    let odd = subnormal | nan;
    if odd == 0 {
        return fast;
    }
    let high = _mm512_srli_epi32::<16>(x);
    let lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(
        x,
        _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb),
    ));
    let quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x0040));
    let exact = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
    _mm256_mask_blend_epi16(odd, fast, exact)
}
