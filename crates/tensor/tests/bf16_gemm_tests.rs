//! The process-wide bf16 kernel switch (`set_bf16_gemm`) through `Tensor::matmul`: each kernel
//! the CPU runs gives the exact result on integer data, where every f32 partial sum is exact
//! and the only rounding is the final one to bf16 (the kernels' own tolerance tests, against an
//! f64 reference on float data, live beside them in `backend::cpu::bf16_gemm`).
//!
//! One test function, because the switch is global to this test binary.

use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_tensor::backend::cpu::bf16_gemm::{
    Bf16Gemm, bf16_gemm, fma_supported, native_supported, set_bf16_gemm,
};
use headroom_tensor::{DType, Tensor};

/// Integers −3..=3, a different pattern per seed.
fn ints(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + seed * 13) % 7) as f32 - 3.0)
        .collect()
}

/// `(batch, m, k) · (batch, k, n)` in f64 over row-major data.
fn reference(a: &[f32], b: &[f32], batch: usize, m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0f32; batch * m * n];
    for i in 0..batch {
        for r in 0..m {
            for col in 0..n {
                let s: f64 = (0..k)
                    .map(|kk| a[(i * m + r) * k + kk] as f64 * b[(i * k + kk) * n + col] as f64)
                    .sum();
                // Round once to bf16, as the kernels do.
                c[(i * m + r) * n + col] = half::bf16::from_f64(s).to_f32();
            }
        }
    }
    c
}

#[test]
fn each_selectable_kernel_multiplies_exactly_on_integers() {
    let device = Device::cpu(64 << 20, AllocatorConfig::default());
    let mut kernels = vec![Bf16Gemm::Widening];
    if fma_supported() {
        kernels.push(Bf16Gemm::Fma);
    } else {
        assert_eq!(set_bf16_gemm(Bf16Gemm::Fma), Bf16Gemm::Widening);
    }
    if native_supported() {
        kernels.push(Bf16Gemm::Native);
    } else {
        // The next kernel down that this CPU runs.
        let next = if fma_supported() {
            Bf16Gemm::Fma
        } else {
            Bf16Gemm::Widening
        };
        assert_eq!(set_bf16_gemm(Bf16Gemm::Native), next);
    }
    // Odd k, ragged m and n, a batch, and the right operand as a transposed view.
    let (batch, m, k, n) = (3, 13, 101, 70);
    let (a, b) = (ints(batch * m * k, 1), ints(batch * k * n, 2));
    let want = reference(&a, &b, batch, m, k, n);
    let bt: Vec<f32> = (0..batch * n * k)
        .map(|x| {
            let (i, col, kk) = (x / (n * k), (x / k) % n, x % k);
            b[(i * k + kk) * n + col]
        })
        .collect();
    for kernel in kernels {
        assert_eq!(set_bf16_gemm(kernel), kernel);
        assert_eq!(bf16_gemm(), kernel);
        let t = |shape: &[usize], data: &[f32]| {
            Tensor::from_f32(&device, shape, data, DType::BF16, Category::Input, None).unwrap()
        };
        let lhs = t(&[batch, m, k], &a);
        let rhs = t(&[batch, n, k], &bt).transpose(-2, -1).unwrap();
        let got = lhs.matmul(&rhs).unwrap().to_vec_f32().unwrap();
        assert_eq!(got, want, "{kernel:?}");
    }
}
