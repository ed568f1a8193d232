//! Matmul throughput of the engine against the `gemm` crate called directly, in the same run.
//! Each bench counts 2·n³ floating-point operations as its items, so divan's item rate is the
//! FLOP rate (`Gitem/s` = GFLOP/s).
//!
//! Run: `cargo bench -p headroom-tensor --bench matmul`

use divan::Bencher;
use divan::counter::ItemsCount;
use half::bf16;
use half::slice::HalfFloatSliceExt;
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_tensor::{DType, Tensor};

const SIZES: [usize; 3] = [512, 1024, 2048];

fn main() {
    divan::main();
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n * n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                / (1u32 << 24) as f32
                - 0.5
        })
        .collect()
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
