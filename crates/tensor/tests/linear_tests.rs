//! The fused linear op (`x·W + b` in one kernel pass): the bits of the composition
//! `x.matmul(w).add(b)` for its output and its three gradients, in every float dtype and on
//! shapes that take the bf16 kernels' different paths (tiles read in place, slabs of k, ragged
//! edges), with bias values that test the second rounding (subnormal, signed zero, NaN,
//! overflow); and one output-sized tensor fewer at the forward's peak.

use crate::common;

use common::{device, output_and_grad_bits, tensor, values};
use headroom_memory::Device;
use headroom_tensor::{DType, Tensor};

/// Output bits and the gradients' bits of x, w and b for `f`.
fn run(
    device: &Device,
    dtype: DType,
    (x, w, b): (&[usize], &[usize], &[f32]),
    f: impl Fn(&Tensor, &Tensor, &Tensor) -> headroom_tensor::Result<Tensor>,
) -> Vec<Vec<u32>> {
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let inputs = [
        tensor(device, x, &values(numel(x), 1, -2.0, 2.0)),
        tensor(device, w, &values(numel(w), 2, -0.5, 0.5)),
        tensor(device, &[b.len()], b),
    ];
    output_and_grad_bits(device, dtype, &inputs, 4, |t| f(&t[0], &t[1], &t[2]))
}

#[test]
fn values_and_gradients_are_the_compositions_bit_for_bit() {
    let device = device();
    // (x shape, w shape): a small batch, whole 32-row tiles with k in two slabs of 512, and a
    // ragged m, n with k in three.
    let cases: [(&[usize], &[usize]); 3] = [
        (&[2, 5, 12], &[12, 7]),
        (&[64, 600], &[600, 48]),
        (&[3, 23, 1088], &[1088, 37]),
    ];
    for (xs, ws) in cases {
        let n = ws[1];
        let bias = values(n, 3, -0.5, 0.5);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let fused = run(&device, dtype, (xs, ws, &bias), |x, w, b| x.linear(w, b));
            let plain = run(&device, dtype, (xs, ws, &bias), |x, w, b| {
                x.matmul(w)?.add(b)
            });
            for (what, (f, p)) in ["output", "dx", "dw", "db"]
                .iter()
                .zip(fused.iter().zip(&plain))
            {
                assert_eq!(f, p, "{dtype:?} {xs:?}·{ws:?} {what}");
            }
        }
    }
}

#[test]
fn the_second_rounding_keeps_the_add_ops_bits_at_the_edges() {
    // A bias the rounded product meets at the edges of bf16: subnormals (kept by the add op's
    // rounding, where the tile store flushes), signed zeros, NaN, the largest finite values
    // (whose sums overflow to infinity) and halfway cases.
    let device = device();
    let edge = [
        1.0e-39,
        -1.0e-39,
        0.0,
        -0.0,
        f32::NAN,
        3.38e38,
        -3.38e38,
        1.0 + 2f32.powi(-8),
        -2f32.powi(-130),
        1.0,
    ];
    let n = 40;
    let bias: Vec<f32> = (0..n).map(|j| edge[j % edge.len()]).collect();
    // The first rows of x are zero, so their sums are the bias itself, subnormals included.
    let mut xs = values(33 * 64, 5, -1e-3, 1e-3);
    xs[..8 * 64].fill(0.0);
    let x = tensor(&device, &[33, 64], &xs);
    let w = tensor(&device, &[64, n], &values(64 * n, 6, -1e-3, 1e-3));
    let b = tensor(&device, &[n], &bias);
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        let [x, w, b] = [&x, &w, &b].map(|t| t.cast(dtype).unwrap());
        let bits = |t: Tensor| -> Vec<u32> {
            let v = t.cast(DType::F32).unwrap().to_vec_f32().unwrap();
            v.iter().map(|v| v.to_bits()).collect()
        };
        let fused = bits(x.linear(&w, &b).unwrap());
        let plain = bits(x.matmul(&w).unwrap().add(&b).unwrap());
        assert_eq!(fused, plain, "{dtype:?}");
    }
}

#[test]
fn the_fused_op_allocates_one_output_instead_of_two() {
    // f32 (70, 96)·(96, 50): the composition holds the product (70·50·4 = 14,000 B, a
    // 14,336 B block at 512 B granularity) while it allocates the sum; the fused op never
    // allocates the product.
    let peak_of = |f: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Tensor| -> i64 {
        let device = device();
        let x = tensor(&device, &[70, 96], &values(70 * 96, 7, -1.0, 1.0));
        let w = tensor(&device, &[96, 50], &values(96 * 50, 8, -1.0, 1.0));
        let b = tensor(&device, &[50], &values(50, 9, -1.0, 1.0));
        let before = device.stats().allocated_bytes.all.current;
        device.lock().reset_peak_stats();
        let y = f(&x, &w, &b);
        let peak = device.stats().allocated_bytes.all.peak - before;
        drop(y);
        peak
    };
    let fused = peak_of(&|x, w, b| x.linear(w, b).unwrap());
    let plain = peak_of(&|x, w, b| x.matmul(w).unwrap().add(b).unwrap());
    assert_eq!(fused, 14_336);
    assert_eq!(plain, 2 * 14_336);
}
