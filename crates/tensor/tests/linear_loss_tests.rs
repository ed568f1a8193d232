//! The chunked output projection and cross-entropy (`Tensor::linear_cross_entropy`): gradients
//! against finite differences, the plain path as the reference (loss and input gradient bitwise,
//! weight gradient within rounding, in f32 and under bf16 autocast), and the activation bytes it
//! keeps, derived by hand from the op rules.

use crate::common;

use common::{check_grads, device, ids, input, tensor, values};
use headroom_memory::{Category, Device};
use headroom_tensor::{DType, Gradients, Tape, Tensor, autocast};

fn targets(device: &Device, shape: &[usize], v: usize, seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let t: Vec<i64> = values(n, seed, 0.0, v as f32)
        .iter()
        .map(|&x| (x as i64).min(v as i64 - 1))
        .collect();
    ids(device, shape, &t)
}

#[test]
fn chunked_gradients_match_finite_differences() {
    // 10 rows in 3 chunks of 4, 4 and 2: the last chunk is short.
    let device = device();
    let y = targets(&device, &[2, 5], 7, 1);
    check_grads(
        &[
            input(&[2, 5, 4], 2, -1.0, 1.0),
            input(&[4, 7], 3, -1.0, 1.0),
        ],
        move |t| t[0].linear_cross_entropy(&t[1], &y, 3),
        1e-2,
        2e-3,
        2e-2,
    );
}

/// Loss, d x and d W of `linear_cross_entropy` with `chunks`, under `cast` (None: f32).
fn run(chunks: usize, cast: Option<DType>) -> (u32, Vec<f32>, Vec<f32>) {
    let device = device();
    let (b, t, c, v) = (3, 32, 48, 200);
    let x = tensor(&device, &[b, t, c], &values(b * t * c, 11, -1.0, 1.0)).track();
    let w = tensor(&device, &[c, v], &values(c * v, 12, -0.5, 0.5)).track();
    let y = targets(&device, &[b, t], v, 13);
    let tape = Tape::new();
    let loss = tape
        .record(|| match cast {
            Some(d) => autocast(d, || x.linear_cross_entropy(&w, &y, chunks)),
            None => x.linear_cross_entropy(&w, &y, chunks),
        })
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let g = |t: &Tensor| grads.get(t).unwrap().to_vec_f32().unwrap();
    (loss.to_scalar_f32().unwrap().to_bits(), g(&x), g(&w))
}

fn assert_chunked_matches_plain(cast: Option<DType>, bitwise_dx_rows: usize, tol: f32) {
    let (loss, dx, dw) = run(1, cast);
    let close = |got: &[f32], want: &[f32], what: &str| {
        let scale = want.iter().fold(0f32, |m, g| m.max(g.abs()));
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!((a - b).abs() <= tol * scale, "{what}[{i}]: {a} vs {b}");
        }
    };
    // 96 rows: chunks of 48, 20 (the last 16), 8, 4, 3, 2 and 1 rows.
    for chunks in [2, 5, 12, 24, 32, 48, 96, 500] {
        let (l, x, w) = run(chunks, cast);
        assert_eq!(l, loss, "loss with {chunks} chunks");
        if 96usize.div_ceil(chunks) >= bitwise_dx_rows {
            assert!(
                x.iter().zip(&dx).all(|(a, b)| a.to_bits() == b.to_bits()),
                "d x with {chunks} chunks"
            );
        } else {
            close(&x, &dx, &format!("d x with {chunks} chunks"));
        }
        close(&w, &dw, &format!("d W with {chunks} chunks"));
    }
}

#[test]
fn chunked_loss_is_the_plain_loss_in_f32() {
    // The gemm crate multiplies products of fewer than 8 rows on another path, whose sums
    // differ in the last bits; reordering a sum of 96 f32 products moves it by a few ulps.
    assert_chunked_matches_plain(None, 8, 1e-5);
}

#[test]
fn chunked_loss_is_the_plain_loss_under_bf16_autocast() {
    // The native bf16 kernel gives a row the same value at any height; the widening fallback
    // runs on gemm, as f32 does. The weight gradient is rounded to bf16 (8 bits of mantissa)
    // per chunk before the sum.
    assert_chunked_matches_plain(Some(DType::BF16), 8, 1e-2);
}

#[test]
fn bad_target_shapes_are_refused() {
    let device = device();
    let x = tensor(&device, &[2, 3, 4], &values(24, 1, -1.0, 1.0));
    let w = tensor(&device, &[4, 5], &values(20, 2, -1.0, 1.0));
    let y = targets(&device, &[3, 2], 5, 3);
    let e = x.linear_cross_entropy(&w, &y, 2).unwrap_err().to_string();
    assert!(e.contains("linear_cross_entropy"), "{e}");
}

/// Bytes the allocator hands out for a request of `bytes` (< 1 MiB): a multiple of 512.
fn block(bytes: usize) -> i64 {
    (bytes.div_ceil(512) * 512) as i64
}

/// `activation` bytes held after forward, at the peak of forward and backward, and after
/// backward, for `chunks` chunks of 64 rows projected from 16 to a vocabulary of 500.
fn activation_bytes(chunks: usize) -> (i64, i64, i64) {
    let (n, c, v) = (64, 16, 500);
    let device = device();
    let x = tensor(&device, &[n, c], &values(n * c, 21, -1.0, 1.0)).track();
    let w = tensor(&device, &[c, v], &values(c * v, 22, -0.5, 0.5)).track();
    let y = targets(&device, &[n], v, 23);
    let tape = Tape::new();
    let loss = tape
        .record(|| x.linear_cross_entropy(&w, &y, chunks))
        .unwrap();
    let current = || device.stats().category_bytes[Category::Activation.index()].current;
    let after_forward = current();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let peak = device.stats().category_bytes[Category::Activation.index()].peak;
    (after_forward, peak, current())
}

#[test]
fn chunked_loss_keeps_no_logits() {
    let loss = block(4);
    // Plain: the f32 logits (64, 500) stay alive through the loss beside the log-softmax output
    // (saved for backward), the picked log-probabilities (64,), their mean and the loss.
    let logits = block(64 * 500 * 4); // 128,000 (a multiple of 512)
    assert_eq!(
        activation_bytes(1),
        (
            logits + loss,
            2 * logits + block(64 * 4) + 2 * block(4),
            loss
        )
    );
    // Chunked: forward keeps only each chunk's picked log-probabilities and the loss; the peak
    // is the last chunk's logits and log-softmax beside the K picked vectors.
    for (chunks, rows) in [(4, 16), (8, 8)] {
        let piece = block(rows * 500 * 4);
        assert_eq!(
            activation_bytes(chunks),
            (loss, 2 * piece + chunks as i64 * block(rows * 4), loss),
            "{chunks} chunks"
        );
    }
}
