//! bf16 and f16 storage against f32. Inputs are first rounded to the 16-bit format and the f32
//! reference runs on those rounded values, so the measured error is the engine's own: f32
//! accumulation plus one rounding of each 16-bit output. Stated tolerances (relative to the
//! largest reference magnitude): one output rounding is ≤ 2⁻⁸ = 0.0039 for bf16 and
//! ≤ 2⁻¹¹ ≈ 0.00049 for f16; multi-op chains (norm, softmax) round intermediates too, so we allow
//! 4 roundings: 0.016 (bf16) and 0.002 (f16).

use crate::common;

use common::{device, values};
use headroom_memory::Category;
use headroom_tensor::{DType, Gradients, Tape, Tensor};

fn t(device: &headroom_memory::Device, shape: &[usize], data: &[f32], dtype: DType) -> Tensor {
    Tensor::from_f32(device, shape, data, dtype, Category::Input, None).unwrap()
}

/// `data` rounded through `dtype` and back to f32.
fn rounded(data: &[f32], dtype: DType) -> Vec<f32> {
    let device = device();
    t(&device, &[data.len()], data, dtype).to_vec_f32().unwrap()
}

fn max_rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()))
        / scale
}

fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => 0.016,
        _ => 0.002,
    }
}

#[test]
fn matmul_in_16_bit_is_within_tolerance_of_f32() {
    let device = device();
    // 600 rows: two bf16 tiles of 512 rows; K = 300, N = 200.
    let (m, k, n) = (600, 300, 200);
    for dtype in [DType::BF16, DType::F16] {
        let a = rounded(&values(m * k, 1, -1.0, 1.0), dtype);
        let b = rounded(&values(k * n, 2, -1.0, 1.0), dtype);
        let want = t(&device, &[m, k], &a, DType::F32)
            .matmul(&t(&device, &[k, n], &b, DType::F32))
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let got16 = t(&device, &[m, k], &a, dtype)
            .matmul(&t(&device, &[k, n], &b, dtype))
            .unwrap();
        assert_eq!(got16.dtype(), dtype);
        let err = max_rel_err(&got16.to_vec_f32().unwrap(), &want);
        assert!(err <= 2f32.powi(-8), "{dtype}: {err}");
        // Transposed rhs goes through the column-major widening path.
        let bt = t(&device, &[n, k], &b, dtype).transpose(0, 1).unwrap();
        let want_t = t(&device, &[m, k], &a, DType::F32)
            .matmul(&t(&device, &[n, k], &b, DType::F32).transpose(0, 1).unwrap())
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let err_t = max_rel_err(
            &t(&device, &[m, k], &a, dtype)
                .matmul(&bt)
                .unwrap()
                .to_vec_f32()
                .unwrap(),
            &want_t,
        );
        assert!(err_t <= 2f32.powi(-8), "{dtype} transposed: {err_t}");
    }
    // The bf16 path's f32 tiles are temporaries: nothing is left behind.
    assert_eq!(
        device.stats().category_bytes[Category::Temporary.index()].current,
        0
    );
}

#[test]
fn forward_and_gradients_of_a_small_network_in_16_bit() {
    let device = device();
    let (n, c, v) = (8, 16, 10);
    for dtype in [DType::BF16, DType::F16] {
        let x = rounded(&values(n * c, 3, -1.0, 1.0), dtype);
        let w = rounded(&values(c * v, 4, -0.5, 0.5), dtype);
        let (g, b) = (
            rounded(&values(c, 5, 0.5, 1.5), dtype),
            rounded(&values(c, 6, -0.2, 0.2), dtype),
        );
        let run = |dt: DType| {
            let xs = t(&device, &[n, c], &x, dt).track();
            let ws = t(&device, &[c, v], &w, dt).track();
            let (gs, bs) = (t(&device, &[c], &g, dt), t(&device, &[c], &b, dt));
            let tape = Tape::new();
            let y = tape
                .record(|| {
                    xs.layer_norm(&gs, &bs, 1e-5)?
                        .matmul(&ws)?
                        .softmax()?
                        .mul(&xs.narrow(1, 0, v)?)?
                        .sum_all()
                })
                .unwrap();
            let mut grads = Gradients::new();
            tape.backward(&y, &mut grads).unwrap();
            (
                y.to_vec_f32().unwrap(),
                grads.get(&xs).unwrap().to_vec_f32().unwrap(),
                grads.get(&ws).unwrap().to_vec_f32().unwrap(),
            )
        };
        let (y32, dx32, dw32) = run(DType::F32);
        let (y16, dx16, dw16) = run(dtype);
        let tol = tolerance(dtype);
        assert!(max_rel_err(&y16, &y32) <= tol, "{dtype} loss");
        assert!(
            max_rel_err(&dx16, &dx32) <= 2.0 * tol,
            "{dtype} dx: {}",
            max_rel_err(&dx16, &dx32)
        );
        assert!(
            max_rel_err(&dw16, &dw32) <= 2.0 * tol,
            "{dtype} dw: {}",
            max_rel_err(&dw16, &dw32)
        );
    }
}
