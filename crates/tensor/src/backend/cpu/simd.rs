//! Wider vectors for the element loops. The workspace builds for baseline x86-64 (SSE2), so
//! LLVM vectorises kernel loops four f32 lanes wide; [`wide`] runs a kernel body compiled for
//! AVX-512 (sixteen lanes) when the CPU has it, chosen at run time.
//!
//! Why results do not change: Rust never contracts `a * b + c` into a fused multiply-add (it
//! emits no fast-math flags), IEEE add, mul, div, sqrt and conversions are correctly rounded
//! at any vector width, and min/max/selects are exact; sums stay sequential in the kernels. So
//! the AVX-512 body computes the same bits as the SSE2 one — only faster.
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
