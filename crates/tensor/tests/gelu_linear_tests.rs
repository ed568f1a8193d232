//! The fused GELU-then-linear op: the same values and gradients as the composition
//! `gelu(x).linear(w, b)`, bit for bit in f32 and bf16, gradients that match finite
//! differences, and one fewer saved tensor of the pre-activation's size.

use crate::common;

use common::{check_grads, device, input, output_and_grad_bits, tensor, values};
use headroom_memory::{Category, Device};
use headroom_tensor::{DType, Gradients, Tape, Tensor};

fn held(device: &Device, c: Category) -> i64 {
    device.stats().category_bytes[c.index()].current
}

/// Output bits and the gradients' bits of x, w and b for `f`.
fn run(
    device: &Device,
    dtype: DType,
    f: impl Fn(&Tensor, &Tensor, &Tensor) -> headroom_tensor::Result<Tensor>,
) -> Vec<Vec<u32>> {
    let inputs = [
        tensor(device, &[2, 5, 12], &values(120, 1, -3.0, 3.0)),
        tensor(device, &[12, 7], &values(84, 2, -0.5, 0.5)),
        tensor(device, &[7], &values(7, 3, -0.5, 0.5)),
    ];
    output_and_grad_bits(device, dtype, &inputs, 4, |t| f(&t[0], &t[1], &t[2]))
}

#[test]
fn values_and_gradients_are_the_compositions_bit_for_bit() {
    let device = device();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let fused = run(&device, dtype, |x, w, b| x.gelu_linear(w, b));
        let plain = run(&device, dtype, |x, w, b| x.gelu()?.linear(w, b));
        for (what, (f, p)) in ["output", "dx", "dw", "db"]
            .iter()
            .zip(fused.iter().zip(&plain))
        {
            assert_eq!(f, p, "{dtype:?} {what}");
        }
    }
}

#[test]
fn gradients_match_finite_differences() {
    check_grads(
        &[
            input(&[3, 4, 6], 11, -2.5, 2.5),
            input(&[6, 5], 12, -1.0, 1.0),
            input(&[5], 13, -1.0, 1.0),
        ],
        |t| t[0].gelu_linear(&t[1], &t[2]),
        1e-2,
        2e-3,
        2e-3,
    );
}

#[test]
fn the_gelu_output_is_not_kept_for_backward() {
    // x (N = 8 rows of F = 64, f32: 2048 bytes) is an input and not an activation, so the
    // composition keeps the GELU output (2048 bytes, saved by the matmul for dw) and the
    // output (8 × 16 × 4 = 512 bytes, held here); the fused op keeps only the output.
    for fused in [false, true] {
        let device = device();
        let x = tensor(&device, &[8, 64], &values(512, 21, -2.0, 2.0)).track();
        let w = tensor(&device, &[64, 16], &values(1024, 22, -0.5, 0.5)).track();
        let b = tensor(&device, &[16], &values(16, 23, -0.5, 0.5)).track();
        let tape = Tape::new();
        let y = tape
            .record(|| {
                if fused {
                    x.gelu_linear(&w, &b)
                } else {
                    x.gelu()?.linear(&w, &b)
                }
            })
            .unwrap();
        let kept = held(&device, Category::Activation);
        assert_eq!(kept, if fused { 512 } else { 2048 + 512 }, "fused: {fused}");
        let loss = tape.record(|| y.sum_all()).unwrap();
        let mut grads = Gradients::new();
        tape.backward(&loss, &mut grads).unwrap();
        assert_eq!(held(&device, Category::Temporary), 0, "fused: {fused}");
    }
}
