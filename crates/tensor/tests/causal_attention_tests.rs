//! Materialised causal attention as one op (`Tensor::causal_attention_materialized`) against
//! the composition it replaces: `q kᵀ → causal softmax → dropout → · v`, with grouped key and
//! value heads repeated per query head (`repeat_interleave`, transformers' `repeat_kv`). The
//! op skips the products the causal mask makes moot; every product it keeps is the full
//! product's multiply-add chain for that entry, cut short only of terms `0 · x`, so up to 512
//! positions (one reduction block of gemm's) outputs and gradients are the composition's bit
//! for bit, and so are its saved tensors.

use crate::common;

use common::{device, values};
use headroom_memory::{Category, Device};
use headroom_tensor::{DType, Gradients, Tape, Tensor, TensorError, autocast, rng};

/// What one run leaves: the bits of the output and of dq, dk, dv, and the activation bytes
/// kept after the forward and at the peak of the forward.
struct Run {
    bits: [Vec<u32>; 4],
    kept: i64,
    peak: i64,
}

/// `(B, H, Hkv, T, D)`, the sliding window, dropout, the dtype, and whether the op runs (else
/// the composition over repeated heads).
fn run(
    [b, h, hkv, t, d]: [usize; 5],
    window: Option<usize>,
    p: f32,
    dtype: DType,
    fused: bool,
) -> Run {
    let device: Device = device();
    let mk = |shape: &[usize], seed| {
        let n = shape.iter().product();
        Tensor::from_f32(
            &device,
            shape,
            &values(n, seed, -2.0, 2.0),
            dtype,
            Category::Input,
            None,
        )
        .unwrap()
        .track()
    };
    let (q, k, v) = (
        mk(&[b, h, t, d], 1),
        mk(&[b, hkv, t, d], 2),
        mk(&[b, hkv, t, d], 3),
    );
    let r = mk(&[b, h, t, d], 4).detach();
    let scale = 1.0 / (d as f32).sqrt();
    rng::manual_seed(7);
    let activations = |what: fn(&headroom_memory::stats::Stat) -> i64| {
        what(&device.stats().category_bytes[Category::Activation.index()])
    };
    let tape = Tape::new();
    let out = tape
        .record(|| {
            if fused {
                return Tensor::causal_attention_materialized(&q, &k, &v, window, scale, p);
            }
            let (k, v) = (
                k.repeat_interleave(1, h / hkv)?,
                v.repeat_interleave(1, h / hkv)?,
            );
            q.matmul(&k.transpose(-2, -1)?)?
                .causal_softmax_window(scale, window)?
                .dropout(p)?
                .matmul(&v)
        })
        .unwrap();
    let (kept, peak) = (activations(|s| s.current), activations(|s| s.peak));
    let loss = tape
        .record(|| out.mul(&r)?.cast(DType::F32)?.sum_all())
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t.cast(DType::F32).unwrap().to_vec_f32().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    };
    let g = |x: &Tensor| bits(grads.get(x).expect("a gradient"));
    Run {
        bits: [bits(&out), g(&q), g(&k), g(&v)],
        kept,
        peak,
    }
}

const NAMES: [&str; 4] = ["out", "dq", "dk", "dv"];

#[test]
fn outputs_and_gradients_are_the_compositions_bit_for_bit() {
    // T inside one 64-row panel, across two (a short tail joining the panel before, or a
    // panel of its own), ragged across four; multi-head, grouped (pairs, multi-query); a
    // sliding window; dropout on the probabilities.
    for (dims, window, p) in [
        ([2, 2, 2, 37, 8], None, 0.0),
        ([1, 2, 2, 100, 8], None, 0.0),
        ([1, 3, 3, 130, 16], None, 0.0),
        ([2, 4, 2, 200, 8], None, 0.0),
        ([1, 4, 1, 129, 8], Some(50), 0.0),
        ([1, 2, 2, 150, 8], None, 0.3),
    ] {
        let fused = run(dims, window, p, DType::F32, true);
        let plain = run(dims, window, p, DType::F32, false);
        for (i, name) in NAMES.iter().enumerate() {
            assert!(
                fused.bits[i] == plain.bits[i],
                "{dims:?} window {window:?} p {p}: {name} differs"
            );
        }
    }
}

#[test]
fn sixteen_bit_inputs_give_the_compositions_bits() {
    // The CPU skips blocks in f32 only; other dtypes run the full products.
    for dtype in [DType::BF16, DType::F16] {
        let dims = [1, 4, 2, 130, 8];
        let fused = run(dims, None, 0.0, dtype, true);
        let plain = run(dims, None, 0.0, dtype, false);
        assert!(fused.bits == plain.bits, "{dtype:?}");
    }
}

#[test]
fn under_autocast_it_is_the_composition_with_softmax_in_f32() {
    // Ungrouped heads: over repeated heads the reference would sum a shared head's gradient in
    // f32 after the cast's rule, where the grouped composition sums it in bf16 before.
    let dims = [1, 4, 4, 130, 8];
    let [fused, plain] =
        [true, false].map(|f| autocast(DType::BF16, || run(dims, None, 0.0, DType::F32, f)));
    assert!(fused.bits == plain.bits);
    assert_eq!((fused.kept, fused.peak), (plain.kept, plain.peak));
    // Grouped heads: the same output; the shared heads' gradients within bf16's rounding of
    // the group's sum.
    let dims = [1, 4, 2, 130, 8];
    let [fused, plain] =
        [true, false].map(|f| autocast(DType::BF16, || run(dims, None, 0.0, DType::F32, f)));
    assert!(fused.bits[0] == plain.bits[0], "out");
    for (i, name) in NAMES.iter().enumerate().skip(1) {
        let [got, want] = [&fused, &plain].map(|r| r.bits[i].iter().map(|&b| f32::from_bits(b)));
        let want: Vec<f32> = want.collect();
        let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
        let err = got.zip(&want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        assert!(err <= 1e-2 * scale, "{name}: {err} of {scale}");
    }
}

#[test]
fn it_keeps_what_the_composition_does_and_frees_the_scores_first() {
    // B·H·T² f32 probabilities kept (with dropout, also the dropped copy) and the output;
    // the scores live beside the probabilities until the softmax has read them. Over repeated heads the composition also
    // keeps the repeated keys and values, which the op reads in place: compare at Hkv = H.
    let (b, h, t) = (2, 3, 130);
    for p in [0.0, 0.3] {
        let fused = run([b, h, h, t, 8], None, p, DType::F32, true);
        let plain = run([b, h, h, t, 8], None, p, DType::F32, false);
        // The caching allocator rounds each block up to 512 bytes.
        let block = |bytes: usize| bytes.div_ceil(512) as i64 * 512;
        let probabilities = block(b * h * t * t * 4);
        let output = block(b * h * t * 8 * 4);
        let copies = if p > 0.0 { 2 } else { 1 };
        let kept = copies * probabilities + output;
        assert_eq!(fused.kept, kept, "p {p}: kept");
        assert_eq!(fused.kept, plain.kept, "p {p}");
        // The scores are freed once the softmax has read them, before the dropout and the
        // output are allocated (the composition held them to the end of its expression).
        assert_eq!(fused.peak, (2 * probabilities).max(kept), "p {p}: peak");
        assert!(plain.peak >= fused.peak, "p {p}");
    }
}

#[test]
fn mismatched_heads_are_refused() {
    let device = device();
    let mk =
        |shape: &[usize]| Tensor::zeros(&device, shape, DType::F32, Category::Input, None).unwrap();
    let (q, k) = (mk(&[1, 6, 10, 4]), mk(&[1, 4, 10, 4]));
    let err = Tensor::causal_attention_materialized(&q, &k, &k, None, 0.5, 0.0).unwrap_err();
    assert!(matches!(err, TensorError::ShapeMismatch { .. }), "{err}");
}

/// Gradients of the tracked subset of (q, k, v) under a loss that reads the output through a
/// transpose (so the output's gradient arrives strided), and the generator's next draw.
fn partial(track: [bool; 3], fused: bool) -> (Vec<Option<Vec<u32>>>, (u64, u64)) {
    let device = device();
    let (b, h, hkv, t, d) = (1, 4, 2, 150, 8);
    let mk = |shape: &[usize], seed, tracked: bool| {
        let n = shape.iter().product();
        let x = Tensor::from_f32(
            &device,
            shape,
            &values(n, seed, -2.0, 2.0),
            DType::F32,
            Category::Input,
            None,
        )
        .unwrap();
        if tracked { x.track() } else { x }
    };
    let (q, k, v) = (
        mk(&[b, h, t, d], 1, track[0]),
        mk(&[b, hkv, t, d], 2, track[1]),
        mk(&[b, hkv, t, d], 3, track[2]),
    );
    let r = mk(&[b, t, h, d], 4, false);
    rng::manual_seed(11);
    let tape = Tape::new();
    let loss = tape
        .record(|| {
            let out = if fused {
                Tensor::causal_attention_materialized(&q, &k, &v, None, 0.3, 0.2)?
            } else {
                let (k, v) = (
                    k.repeat_interleave(1, h / hkv)?,
                    v.repeat_interleave(1, h / hkv)?,
                );
                q.matmul(&k.transpose(-2, -1)?)?
                    .causal_softmax(0.3)?
                    .dropout(0.2)?
                    .matmul(&v)?
            };
            out.transpose(1, 2)?.mul(&r)?.sum_all()
        })
        .unwrap();
    let next = rng::advance(1);
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let bits = |x: &Tensor| {
        grads.get(x).map(|g| {
            let v = g.to_vec_f32().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        })
    };
    (vec![bits(&q), bits(&k), bits(&v)], (next.seed, next.offset))
}

#[test]
fn any_subset_of_inputs_gets_the_compositions_gradients_and_the_generator_moves_alike() {
    for track in [
        [true, false, false],
        [false, true, false],
        [false, false, true],
        [true, false, true],
    ] {
        let (fused, fused_next) = partial(track, true);
        let (plain, plain_next) = partial(track, false);
        for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
            assert_eq!(fused[i].is_some(), track[i], "{track:?}: {name} presence");
            assert!(fused[i] == plain[i], "{track:?}: {name} differs");
        }
        assert_eq!(fused_next, plain_next, "{track:?}: the generator's cursor");
    }
}
