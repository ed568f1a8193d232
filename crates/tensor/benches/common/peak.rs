//! The machine's arithmetic peak, measured: every rayon thread runs the same register-only loop
//! of independent multiply-add chains (no loads or stores), so the FLOP rate is what the cores
//! can issue. `peak_f32` uses 512-bit FMA (`VFMADD231PS`, 32 flop per instruction), `peak_bf16`
//! `VDPBF16PS` (64 flop: 16 lanes × 2 bf16 products, each a multiply and an add). 24 chains
//! are more than the instructions' latency × issue rate (4–6 cycles × 2 per cycle; Agner Fog's
//! instruction tables), so latency does not cap the rate: on a Zen 5 core 12 chains gave 9 %
//! less `VDPBF16PS` rate than 24 (measured), the FMA rate the same.
//!
//! Used by the `matmul` bench so that GEMM GFLOP/s and the peaks come from one run.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Iterations of the chain loop per thread and sample.
pub const ITERS: usize = 1 << 20;
/// Independent accumulators per thread.
pub const CHAINS: usize = 24;

/// Flop counted by one sample on `threads` threads, for `flop_per_instruction`.
pub fn flop(threads: usize, flop_per_instruction: usize) -> usize {
    threads * ITERS * CHAINS * flop_per_instruction
}

/// Runs `ITERS` rounds of `CHAINS` FMAs; returns a value that depends on every chain.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn fma_chains(seed: f32) -> f32 {
    let (a, b) = (_mm512_set1_ps(0.999), _mm512_set1_ps(1e-3));
    let mut acc = [_mm512_set1_ps(seed); CHAINS];
    for _ in 0..ITERS {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    let sum = acc
        .iter()
        .fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x));
    _mm512_reduce_add_ps(sum)
}

/// Runs `ITERS` rounds of `CHAINS` `VDPBF16PS`; returns a value that depends on every chain.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn dpbf16_chains(seed: f32) -> f32 {
    let a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3), _mm512_set1_ps(-1e-3));
    let b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5), _mm512_set1_ps(0.5));
    let mut acc = [_mm512_set1_ps(seed); CHAINS];
    for _ in 0..ITERS {
        for x in acc.iter_mut() {
            *x = _mm512_dpbf16_ps(*x, a, b);
        }
    }
    let sum = acc
        .iter()
        .fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x));
    _mm512_reduce_add_ps(sum)
}
