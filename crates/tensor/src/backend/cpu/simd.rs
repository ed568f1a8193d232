//! Wider vectors for the element loops. The workspace builds for baseline x86-64 (SSE2), so
//! LLVM vectorises kernel loops four f32 lanes wide; [`wide`] runs a kernel body compiled for
//! AVX-512 (sixteen lanes) when the CPU has it, chosen at run time.
//!
//! Why results do not change: Rust never contracts `a * b + c` into a fused multiply-add (it
//! emits no fast-math flags), IEEE add, mul, div, sqrt and conversions are correctly rounded
//! at any vector width, and min/max/selects are exact; sums stay sequential in the kernels. So
//! the AVX-512 body computes the same bits as the SSE2 one — only faster.
//!
//! [`transpose16`] is the register transpose the packing, reduction and attention kernels share.
//!
//! Not for: matmul (gemm picks its own AVX-512 kernels).

/// Runs `body` compiled with AVX-512F when the CPU supports it, else as is. Pass a closure
/// marked `#[inline(always)]` so its loops are compiled inside the AVX-512 function.
#[inline(always)]
pub fn wide<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked just above), the only requirement of
        // calling a `target_feature(enable = "avx512f")` function.
        return unsafe { avx512(body) };
    }
    body()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512<R>(body: impl FnOnce() -> R) -> R {
    body()
}

/// The transpose of a 16 × 16 block of 32-bit values (`r[i]` holds row i; vector j of the
/// result holds column j): 32- and 64-bit interleaves within 128-bit lanes, then two rounds of
/// 128-bit lane shuffles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn transpose16(r: [std::arch::x86_64::__m512i; 16]) -> [std::arch::x86_64::__m512i; 16] {
    use std::arch::x86_64::*;
    let t: [__m512i; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    let u: [__m512i; 16] = std::array::from_fn(|i| {
        let (base, j) = (i & !3, i % 4);
        let (a, b) = (t[base + j / 2], t[base + j / 2 + 2]);
        if j % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    let v: [__m512i; 16] = std::array::from_fn(|i| {
        let (base, j) = (i & !7, i % 4);
        let (a, b) = (u[base + j], u[base + 4 + j]);
        if i % 8 < 4 {
            _mm512_shuffle_i32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_i32x4::<0xdd>(a, b)
        }
    });
    std::array::from_fn(|i| {
        let (a, b) = (v[i % 8], v[8 + i % 8]);
        if i < 8 {
            _mm512_shuffle_i32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_i32x4::<0xdd>(a, b)
        }
    })
}

/// [`transpose16`] of f32 rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn transpose16_ps(
    r: [std::arch::x86_64::__m512; 16],
) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    // SAFETY: __m512 and __m512i are both 64 bytes of plain bits; the arrays have one size.
    // (A per-vector cast through `array::map` was measured to stay out of line, through
    // memory, at about 3 % of a bf16 training step.)
    unsafe {
        std::mem::transmute::<[__m512i; 16], [__m512; 16]>(transpose16(std::mem::transmute::<
            [__m512; 16],
            [__m512i; 16],
        >(r)))
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_register_transpose_moves_every_element() {
        if !std::is_x86_feature_detected!("avx512f") {
            return; // the path under test does not run on this CPU
        }
        use std::arch::x86_64::*;
        let rows: Vec<[f32; 16]> = (0..16)
            .map(|k| std::array::from_fn(|j| (k * 16 + j) as f32))
            .collect();
        // SAFETY: AVX-512F checked above; each row holds 16 f32.
        let cols = unsafe {
            let r = std::array::from_fn(|k| _mm512_loadu_ps(rows[k].as_ptr()));
            super::transpose16_ps(r)
        };
        for (j, col) in cols.iter().enumerate() {
            let mut v = [0.0f32; 16];
            // SAFETY: `v` has room for 16 f32.
            unsafe { _mm512_storeu_ps(v.as_mut_ptr(), *col) };
            let want: [f32; 16] = std::array::from_fn(|k| (k * 16 + j) as f32);
            assert_eq!(v, want, "column {j}");
        }
    }
}
