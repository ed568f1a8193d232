//! Sliding-window attention (Mistral's mask: query `i` sees keys `i + 1 − w ..= i`) in both
//! kernels, the windowed causal softmax of the naive path and the fused memory-efficient
//! attention, against an independent reference: the scores plus an explicit additive mask of 0
//! and −∞ built on the host, then the plain softmax. Outputs and the gradients of q, k and v,
//! for windows narrower than a row, across the fused kernel's 64-key tiles, and wider than the
//! sequence (where it is the causal mask, bit for bit).
//!
//! Tolerance (f32): the kernels and the reference sum the same products in different orders
//! (the fused one rescales once per key tile), a few ulps of the largest value: 1e-5 of it.

use crate::common;

use common::{device, values};
use headroom_memory::{Category, Device};
use headroom_tensor::{DType, Gradients, Tape, Tensor, TensorError};

#[derive(Clone, Copy, PartialEq)]
enum Path {
    Fused,
    Naive,
    Reference,
}

/// The additive mask of a window `w` over `t` positions: 0 where key j is visible to query i.
fn mask(device: &Device, t: usize, w: usize) -> Tensor {
    let m: Vec<f32> = (0..t * t)
        .map(|k| {
            let (i, j) = (k / t, k % t);
            if j <= i && j + w > i {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    Tensor::from_f32(device, &[t, t], &m, DType::F32, Category::Input, None).unwrap()
}

/// Output and the gradients of q, k, v of L = Σ r ⊙ attn(q, k, v).
fn run(shape: [usize; 4], window: usize, path: Path) -> [Vec<f32>; 4] {
    let device = device();
    let n: usize = shape.iter().product();
    let mk = |seed| {
        Tensor::from_f32(
            &device,
            &shape,
            &values(n, seed, -2.0, 2.0),
            DType::F32,
            Category::Input,
            None,
        )
        .unwrap()
    };
    let (q, k, v) = (mk(1).track(), mk(2).track(), mk(3).track());
    let r = mk(4);
    let scale = 1.0 / (shape[3] as f32).sqrt();
    let tape = Tape::new();
    let (out, loss) = tape
        .record(|| {
            let out = match path {
                Path::Fused => {
                    Tensor::attention_masked(&q, &k, &v, Some(Some(window)), scale, 0.0)?
                }
                Path::Naive => q
                    .matmul(&k.transpose(-1, -2)?)?
                    .causal_softmax_window(scale, Some(window))?
                    .matmul(&v)?,
                Path::Reference => q
                    .matmul(&k.transpose(-1, -2)?)?
                    .scale(scale)?
                    .add(&mask(&device, shape[2], window))?
                    .softmax()?
                    .matmul(&v)?,
            };
            let loss = out.mul(&r)?.sum_all()?;
            Ok::<_, TensorError>((out, loss))
        })
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let g = |t: &Tensor| grads.get(t).unwrap().to_vec_f32().unwrap();
    [out.to_vec_f32().unwrap(), g(&q), g(&k), g(&v)]
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()))
        / scale
}

#[test]
fn both_kernels_match_an_explicit_additive_mask() {
    // T = 37 inside one tile, T = 130 across three; windows of 1 (each query sees itself),
    // 3, 70 (wider than a tile) and 200 (the whole causal past).
    for t in [37, 130] {
        for w in [1, 3, 70, 200] {
            let shape = [2, 2, t, 8];
            let want = run(shape, w, Path::Reference);
            for path in [Path::Fused, Path::Naive] {
                let got = run(shape, w, path);
                for (i, name) in ["out", "dq", "dk", "dv"].iter().enumerate() {
                    let err = rel_err(&got[i], &want[i]);
                    let kind = if path == Path::Fused {
                        "fused"
                    } else {
                        "naive"
                    };
                    assert!(err <= 1e-5, "T={t} w={w} {kind} {name}: {err}");
                }
            }
        }
    }
}

#[test]
fn a_window_of_one_returns_each_querys_own_value() {
    let [out, ..] = run([1, 2, 20, 4], 1, Path::Fused);
    let n = 2 * 20 * 4;
    let v = values(n, 3, -2.0, 2.0);
    assert_eq!(rel_err(&out, &v), 0.0);
}

#[test]
fn a_window_as_long_as_the_sequence_is_the_causal_mask_bit_for_bit() {
    let device = device();
    let x = Tensor::from_f32(
        &device,
        &[3, 9, 9],
        &values(243, 5, -3.0, 3.0),
        DType::F32,
        Category::Input,
        None,
    )
    .unwrap();
    let plain = x.causal_softmax(0.5).unwrap().to_vec_f32().unwrap();
    let windowed = x
        .causal_softmax_window(0.5, Some(9))
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert_eq!(plain, windowed);
}

#[test]
fn a_window_of_zero_is_refused() {
    let device = device();
    let x = Tensor::from_f32(
        &device,
        &[1, 1, 4, 2],
        &[0.0; 8],
        DType::F32,
        Category::Input,
        None,
    )
    .unwrap();
    let err = Tensor::attention_masked(&x, &x, &x, Some(Some(0)), 1.0, 0.0).unwrap_err();
    assert!(err.to_string().contains("at least one key"), "{err}");
    assert!(x.causal_softmax_window(1.0, Some(0)).is_err());
}
