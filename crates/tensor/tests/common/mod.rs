//! Shared test helpers: a device, deterministic pseudo-random data, the central
//! finite-difference gradient checker, and the bits of an op's output and gradients (for
//! comparing a fused op with its composition).

#![allow(dead_code)]

use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_tensor::{DType, Gradients, Tape, Tensor, no_grad, rng};

pub fn device() -> Device {
    Device::cpu(256 << 20, AllocatorConfig::default())
}

/// Deterministic values in [lo, hi) from a seed (a simple LCG; independent of the engine).
pub fn values(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

pub fn tensor(device: &Device, shape: &[usize], data: &[f32]) -> Tensor {
    Tensor::from_f32(device, shape, data, DType::F32, Category::Input, None).unwrap()
}

pub fn ids(device: &Device, shape: &[usize], data: &[i64]) -> Tensor {
    Tensor::from_i64(device, shape, data, DType::I64, Category::Input, None).unwrap()
}

pub fn assert_close(got: &[f32], want: &[f64], atol: f64, rtol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = atol + rtol * w.abs();
        assert!(
            ((g as f64) - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w} (tol {tol})"
        );
    }
}

/// One input of a gradient check: a shape and its values.
pub struct Input {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

pub fn input(shape: &[usize], seed: u64, lo: f32, hi: f32) -> Input {
    let n = shape.iter().product();
    Input {
        shape: shape.to_vec(),
        data: values(n, seed, lo, hi),
    }
}

/// Checks the gradients backward gives for `f` against central finite differences.
///
/// The scalar checked is L = Σ r ⊙ f(inputs) with fixed pseudo-random weights r, so every
/// output element's gradient path is exercised. dL/dxᵢ ≈ (L(x + h eᵢ) − L(x − h eᵢ)) / 2h,
/// with L summed in f64 on the host. The RNG cursor is reset before every evaluation so ops
/// that draw random numbers see the same stream.
pub fn check_grads(
    inputs: &[Input],
    f: impl Fn(&[Tensor]) -> headroom_tensor::Result<Tensor>,
    h: f32,
    atol: f64,
    rtol: f64,
) {
    check_grads_on(&device(), inputs, f, h, atol, rtol)
}

/// `check_grads` on a given device (for functions that capture tensors of that device).
pub fn check_grads_on(
    device: &Device,
    inputs: &[Input],
    f: impl Fn(&[Tensor]) -> headroom_tensor::Result<Tensor>,
    h: f32,
    atol: f64,
    rtol: f64,
) {
    let device = device.clone();
    let start = rng::get_state();
    let eval = |data: &[Vec<f32>]| -> f64 {
        rng::set_state(start);
        let ts: Vec<Tensor> = inputs
            .iter()
            .zip(data)
            .map(|(i, d)| tensor(&device, &i.shape, d))
            .collect();
        let y = no_grad(|| f(&ts)).unwrap();
        let r = values(y.numel(), 99, -1.0, 1.0);
        y.to_vec_f32()
            .unwrap()
            .iter()
            .zip(&r)
            .map(|(&a, &b)| a as f64 * b as f64)
            .sum()
    };
    // Analytic gradients.
    rng::set_state(start);
    let tracked: Vec<Tensor> = inputs
        .iter()
        .map(|i| tensor(&device, &i.shape, &i.data).track())
        .collect();
    let tape = Tape::new();
    let loss = tape
        .record(|| {
            let y = f(&tracked)?;
            let r = tensor(&device, y.shape(), &values(y.numel(), 99, -1.0, 1.0));
            y.mul(&r)?.sum_all()
        })
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let base: Vec<Vec<f32>> = inputs.iter().map(|i| i.data.clone()).collect();
    for (k, t) in tracked.iter().enumerate() {
        let Some(g) = grads.get(t) else {
            // No path from this input to the loss: every finite difference must be zero.
            for i in 0..base[k].len() {
                let (mut p, mut m) = (base.clone(), base.clone());
                p[k][i] += h;
                m[k][i] -= h;
                assert!(
                    (eval(&p) - eval(&m)).abs() < 1e-6,
                    "input {k} has no gradient but affects the output"
                );
            }
            continue;
        };
        assert_eq!(g.shape(), t.shape(), "gradient shape of input {k}");
        let analytic = g.to_vec_f32().unwrap();
        let numeric: Vec<f64> = (0..base[k].len())
            .map(|i| {
                let (mut p, mut m) = (base.clone(), base.clone());
                p[k][i] += h;
                m[k][i] -= h;
                (eval(&p) - eval(&m)) / (2.0 * h as f64)
            })
            .collect();
        assert_close(&analytic, &numeric, atol, rtol, &format!("d/d input {k}"));
    }
    rng::set_state(start);
}

/// The bits of `f`'s output and of the gradients of `inputs` (cast to `dtype` and tracked)
/// under the loss `Σ f(inputs) ⊙ r`, `r` uniform in [−1, 1) from `seed`: equal for a fused op
/// and its composition exactly when both forward and backward give the same bits.
pub fn output_and_grad_bits(
    device: &Device,
    dtype: DType,
    inputs: &[Tensor],
    seed: u64,
    f: impl Fn(&[Tensor]) -> headroom_tensor::Result<Tensor>,
) -> Vec<Vec<u32>> {
    let xs: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.cast(dtype).unwrap().track())
        .collect();
    let tape = Tape::new();
    let (y, loss) = tape
        .record(|| {
            let y = f(&xs)?;
            let r = tensor(device, y.shape(), &values(y.numel(), seed, -1.0, 1.0)).cast(dtype)?;
            let loss = y.mul(&r)?.cast(DType::F32)?.sum_all()?;
            Ok::<_, headroom_tensor::TensorError>((y, loss))
        })
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t.cast(DType::F32).unwrap().to_vec_f32().unwrap();
        v.iter().map(|v| v.to_bits()).collect()
    };
    let mut out = vec![bits(&y)];
    out.extend(xs.iter().map(|x| bits(grads.get(x).expect("a gradient"))));
    out
}
