//! The fused causal softmax: the bits of `scale → causal_mask → softmax` forward and backward
//! in f32, bf16 and f16 (square and rectangular score matrices, row counts that do not fill the
//! kernel's 16-row blocks), gradients that match finite differences, and only the output kept.

use crate::common;

use common::{check_grads, device, input, output_and_grad_bits, tensor, values};
use headroom_memory::{Category, Device};
use headroom_tensor::{DType, Tape, Tensor};

/// Bits of the output and of the input's gradient under a random output weighting.
fn run(
    device: &Device,
    shape: &[usize],
    dtype: DType,
    f: impl Fn(&Tensor) -> headroom_tensor::Result<Tensor>,
) -> Vec<Vec<u32>> {
    let n = shape.iter().product();
    let x = tensor(device, shape, &values(n, 5, -6.0, 6.0));
    output_and_grad_bits(device, dtype, &[x], 6, |t| f(&t[0]))
}

#[test]
fn forward_and_backward_are_the_three_ops_bit_for_bit() {
    let device = device();
    let scale = 1.0 / 8f32.sqrt();
    for shape in [[2, 3, 37, 37], [1, 2, 5, 9], [1, 1, 40, 24], [2, 1, 1, 1]] {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let fused = run(&device, &shape, dtype, |x| x.causal_softmax(scale));
            let plain = run(&device, &shape, dtype, |x| {
                x.scale(scale)?.causal_mask()?.softmax()
            });
            assert_eq!(fused[0], plain[0], "{shape:?} {dtype:?}: output");
            assert_eq!(fused[1], plain[1], "{shape:?} {dtype:?}: gradient");
        }
    }
}

#[test]
fn masked_probabilities_are_zero_and_kept_rows_sum_to_one() {
    let device = device();
    let x = tensor(&device, &[1, 6, 6], &values(36, 9, -3.0, 3.0));
    let y = x.causal_softmax(0.5).unwrap().to_vec_f32().unwrap();
    for i in 0..6 {
        let row = &y[i * 6..(i + 1) * 6];
        assert!(row[i + 1..].iter().all(|&p| p == 0.0), "row {i}: {row:?}");
        let total: f32 = row.iter().sum();
        assert!((total - 1.0).abs() < 1e-6, "row {i} sums to {total}");
    }
}

#[test]
fn gradients_match_finite_differences() {
    check_grads(
        &[input(&[2, 7, 7], 31, -2.0, 2.0)],
        |t| t[0].causal_softmax(0.7),
        1e-2,
        2e-3,
        1e-2,
    );
}

#[test]
fn only_the_output_is_kept() {
    // (2, 16, 16) f32 scores: 2048 bytes. The three ops keep the softmax output and free the
    // scaled and masked scores; the fused op allocates nothing else. Both keep 2048 bytes.
    let device = device();
    let x = tensor(&device, &[2, 16, 16], &values(512, 3, -1.0, 1.0)).track();
    let tape = Tape::new();
    let y = tape.record(|| x.causal_softmax(0.25)).unwrap();
    assert_eq!(
        device.stats().category_bytes[Category::Activation.index()].current,
        2048
    );
    let peak = device.stats().category_bytes[Category::Activation.index()].peak;
    assert_eq!(peak, 2048, "no scratch of the scores' size");
    drop(y);
}
