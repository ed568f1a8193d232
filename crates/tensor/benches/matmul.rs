//! Matmul throughput of the engine against the `gemm` crate called directly, in the same run.
//! Each bench counts 2·n³ floating-point operations as its items, so divan's item rate is the
//! FLOP rate (`Gitem/s` = GFLOP/s).
//!
//! The `gpt_*` benches time the GEMM shapes of one training step of a GPT of width 384,
//! sequence 256 and micro-batch 16 (4096 tokens) plus a 1024³ square, on AMX tiles (where the CPU
//! has them), the native bf16 kernel (`VDPBF16PS`), the widening fallback and f32, all through
//! `Tensor::matmul`.
//!
//! `peak_f32` and `peak_bf16` measure the cores' FMA and `VDPBF16PS` peaks in the same run
//! (register-only loops on every rayon thread, `common/peak.rs`), so each GEMM rate can be read
//! as a fraction of the peak of its own instruction.
//!
//! Run: `cargo bench -p headroom-tensor --bench matmul`

mod common;
#[path = "common/peak.rs"]
mod peak;

use divan::Bencher;
use divan::counter::ItemsCount;
use half::bf16;
use half::slice::HalfFloatSliceExt;
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_tensor::backend::cpu::bf16_gemm::{Bf16Gemm, set_bf16_gemm};
use headroom_tensor::{DType, Tensor};
use std::fmt;

const SIZES: [usize; 3] = [512, 1024, 2048];

fn main() {
    divan::main();
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    common::values(n * n, seed)
}

fn flops(n: usize) -> ItemsCount {
    ItemsCount::new(2 * n * n * n)
}

fn engine(bencher: Bencher, n: usize, dtype: DType) {
    let device = Device::cpu(1 << 30, AllocatorConfig::default());
    let a = Tensor::from_f32(&device, &[n, n], &data(n, 1), dtype, Category::Input, None).unwrap();
    let b = Tensor::from_f32(&device, &[n, n], &data(n, 2), dtype, Category::Input, None).unwrap();
    bencher
        .counter(flops(n))
        .bench_local(|| a.matmul(&b).unwrap());
}

/// `c = a·b` with gemm on row-major slices, as a user of the crate would call it.
fn gemm_f32(a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
    // SAFETY: all three slices hold n·n row-major f32 values.
    unsafe {
        gemm::gemm(
            n,
            n,
            n,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            n as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(rayon::current_num_threads()),
        )
    }
}

#[divan::bench(args = SIZES, sample_count = 10, sample_size = 1)]
fn engine_f32(bencher: Bencher, n: usize) {
    engine(bencher, n, DType::F32);
}

#[divan::bench(args = SIZES, sample_count = 10, sample_size = 1)]
fn gemm_direct_f32(bencher: Bencher, n: usize) {
    let (a, b) = (data(n, 1), data(n, 2));
    let mut c = vec![0.0f32; n * n];
    bencher
        .counter(flops(n))
        .bench_local(|| gemm_f32(&a, &b, &mut c, n));
}

#[divan::bench(args = SIZES, sample_count = 10, sample_size = 1)]
fn engine_bf16(bencher: Bencher, n: usize) {
    set_bf16_gemm(Bf16Gemm::Native);
    engine(bencher, n, DType::BF16);
}

/// The direct baseline for bf16 (gemm has no bf16 kernel): widen both operands to f32 with
/// `half`'s slice conversion, one f32 gemm, narrow the result.
#[divan::bench(args = SIZES, sample_count = 10, sample_size = 1)]
fn gemm_direct_bf16_via_f32(bencher: Bencher, n: usize) {
    let to_bf16 = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let (a, b) = (to_bf16(data(n, 1)), to_bf16(data(n, 2)));
    let (mut af, mut bf, mut cf) = (
        vec![0.0f32; n * n],
        vec![0.0f32; n * n],
        vec![0.0f32; n * n],
    );
    let mut c = vec![bf16::ZERO; n * n];
    bencher.counter(flops(n)).bench_local(|| {
        a.convert_to_f32_slice(&mut af);
        b.convert_to_f32_slice(&mut bf);
        gemm_f32(&af, &bf, &mut cf, n);
        c.convert_from_f32_slice(&cf);
    });
}

#[divan::bench(args = SIZES, sample_count = 10, sample_size = 1)]
fn engine_f16(bencher: Bencher, n: usize) {
    engine(bencher, n, DType::F16);
}

/// One GEMM `(m × k) · (k × n)`; a transposed operand is a transposed view of a stored
/// (k × m) or (n × k) tensor, as backward hands it in.
#[derive(Debug, Clone, Copy)]
struct Gemm {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    a_t: bool,
    b_t: bool,
}

impl fmt::Display for Gemm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = |x: bool| if x { "ᵀ" } else { "" };
        write!(
            f,
            "{} {}x{}{}·{}x{}{}",
            self.name,
            self.m,
            self.k,
            t(self.a_t),
            self.k,
            self.n,
            t(self.b_t)
        )
    }
}

const fn gemm(name: &'static str, m: usize, k: usize, n: usize, a_t: bool, b_t: bool) -> Gemm {
    Gemm {
        name,
        m,
        k,
        n,
        a_t,
        b_t,
    }
}

/// Tokens of one micro-batch (16 × 256) and the model width.
const T: usize = 4096;
const C: usize = 384;

/// Forward `x·W`, backward `dX = dY·Wᵀ` and `dW = xᵀ·dY` of the attention input (qkv, 3C),
/// the attention output (proj, C) and the MLP (fc 4C, fc2 back to C), then a square.
const GPT: [Gemm; 10] = [
    gemm("qkv", T, C, 3 * C, false, false),
    gemm("proj", T, C, C, false, false),
    gemm("fc", T, C, 4 * C, false, false),
    gemm("fc2", T, 4 * C, C, false, false),
    gemm("dx.qkv", T, 3 * C, C, false, true),
    gemm("dx.fc", T, 4 * C, C, false, true),
    gemm("dx.fc2", T, C, 4 * C, false, true),
    gemm("dw.qkv", C, T, 3 * C, true, false),
    gemm("dw.fc2", 4 * C, T, C, true, false),
    gemm("square", 1024, 1024, 1024, false, false),
];

fn gpt(bencher: Bencher, g: Gemm, dtype: DType) {
    batched(bencher, g, &[], dtype);
}

/// Times `g` over leading dims `batch` (one product each), the operands stored as `gpt`'s are.
fn batched(bencher: Bencher, g: Gemm, batch: &[usize], dtype: DType) {
    let device = Device::cpu(1 << 30, AllocatorConfig::default());
    let products: usize = batch.iter().product();
    let stored = |rows: usize, cols: usize, t: bool, seed: u32| {
        let mut shape = batch.to_vec();
        shape.extend(if t { [cols, rows] } else { [rows, cols] });
        let x = Tensor::from_f32(
            &device,
            &shape,
            &common::values(products * rows * cols, seed),
            dtype,
            Category::Input,
            None,
        )
        .unwrap();
        if t { x.transpose(-2, -1).unwrap() } else { x }
    };
    let a = stored(g.m, g.k, g.a_t, 1);
    let b = stored(g.k, g.n, g.b_t, 2);
    bencher
        .counter(ItemsCount::new(products * 2 * g.m * g.k * g.n))
        .bench_local(|| a.matmul(&b).unwrap());
}

#[divan::bench(args = GPT, sample_count = 10, sample_size = 1)]
fn gpt_bf16_native(bencher: Bencher, g: Gemm) {
    assert_eq!(
        set_bf16_gemm(Bf16Gemm::Native),
        Bf16Gemm::Native,
        "no AVX512_BF16 here"
    );
    gpt(bencher, g, DType::BF16);
}

/// AMX tiles (`TDPBF16PS`), on CPUs that have them (Xeon Sapphire Rapids and later); skipped
/// elsewhere.
#[divan::bench(args = GPT, sample_count = 10, sample_size = 1)]
fn gpt_bf16_amx(bencher: Bencher, g: Gemm) {
    if set_bf16_gemm(Bf16Gemm::Amx) != Bf16Gemm::Amx {
        eprintln!("gpt_bf16_amx: this CPU has no AMX-BF16 (or the OS did not grant it); skipped");
        return;
    }
    gpt(bencher, g, DType::BF16);
}

/// bf16 widened to f32 while packing, f32 FMA (the bf16 kernel of Intel CPUs without AMX).
#[divan::bench(args = GPT, sample_count = 10, sample_size = 1)]
fn gpt_bf16_fma(bencher: Bencher, g: Gemm) {
    if set_bf16_gemm(Bf16Gemm::Fma) != Bf16Gemm::Fma {
        eprintln!("gpt_bf16_fma: this CPU has no AVX-512; skipped");
        return;
    }
    gpt(bencher, g, DType::BF16);
}

#[divan::bench(args = GPT, sample_count = 10, sample_size = 1)]
fn gpt_bf16_widening(bencher: Bencher, g: Gemm) {
    set_bf16_gemm(Bf16Gemm::Widening);
    gpt(bencher, g, DType::BF16);
}

#[divan::bench(args = GPT, sample_count = 10, sample_size = 1)]
fn gpt_f32(bencher: Bencher, g: Gemm) {
    gpt(bencher, g, DType::F32);
}

/// Every rayon thread runs `chains`; the sample counts all threads' flop.
fn peak(bencher: Bencher, flop_per_instruction: usize, chains: unsafe fn(f32) -> f32) {
    let threads = rayon::current_num_threads();
    bencher
        .counter(ItemsCount::new(peak::flop(threads, flop_per_instruction)))
        .bench_local(|| {
            // SAFETY: the callers checked the CPU features `chains` needs.
            rayon::broadcast(|ctx| unsafe { chains(ctx.index() as f32) })
        });
}

/// 512-bit FMA: 16 lanes × (multiply + add).
#[cfg(target_arch = "x86_64")]
#[divan::bench(sample_count = 10, sample_size = 1)]
fn peak_f32(bencher: Bencher) {
    if !std::is_x86_feature_detected!("avx512f") {
        eprintln!("peak_f32: this CPU has no AVX-512F; skipped");
        return;
    }
    peak(bencher, 32, peak::fma_chains);
}

/// 512-bit `VDPBF16PS`: 16 lanes × 2 bf16 products × (multiply + add).
#[cfg(target_arch = "x86_64")]
#[divan::bench(sample_count = 10, sample_size = 1)]
fn peak_bf16(bencher: Bencher) {
    if !(std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16")) {
        eprintln!("peak_bf16: this CPU has no AVX512_BF16; skipped");
        return;
    }
    peak(bencher, 64, peak::dpbf16_chains);
}

/// The attention products of the GPT above, each over its 16 × 6 heads of 256 tokens × 64
/// features: forward q·kᵀ and p·v, and two of backward's, with a transposed operand.
const HEADS: [Gemm; 4] = [
    gemm("q·kᵀ", 256, 64, 256, false, true),
    gemm("p·v", 256, 256, 64, false, false),
    gemm("pᵀ·do", 256, 256, 64, true, false),
    gemm("do·vᵀ", 256, 64, 256, false, true),
];

/// The 96 products of one attention core, in one batched `Tensor::matmul`.
#[divan::bench(args = HEADS, sample_count = 20, sample_size = 1)]
fn attention_f32(bencher: Bencher, g: Gemm) {
    batched(bencher, g, &[16, 6], DType::F32);
}
