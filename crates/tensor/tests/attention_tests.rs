//! The fused memory-efficient attention (`Tensor::attention`) against the naive composition
//! `softmax(causal_mask(q kᵀ·scale)) v` (with `dropout` on the probabilities), against central
//! finite differences, in bf16 against f32, in bytes (what it saves and its peak, derived by
//! hand) and for bitwise determinism across thread counts.
//!
//! Tolerances. f32: the fused op and the composition sum the same products in different orders
//! and tiles (online rescaling adds one rounding per key block), so outputs and gradients agree
//! to a few f32 ulps of the largest magnitude: we allow 1e-5 of the largest reference value.
//! bf16: inputs are rounded to bf16 first and the f32 result on those values is the reference;
//! outputs round once (2⁻⁸), gradients also use the bf16-rounded output in Dᵢ = dOᵢ·Oᵢ, so we
//! allow 4 roundings, 0.016, as the precision tests do.

use crate::common;

use common::{check_grads, device, input, tensor, values};
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_tensor::{DType, Gradients, Tape, Tensor, TensorError, rng};

/// The fused kernel's tile (queries and keys per block).
const TILE: usize = 64;

fn naive(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: f32, p: f32) -> Tensor {
    let s = q
        .matmul(&k.transpose(-1, -2).unwrap())
        .unwrap()
        .scale(scale)
        .unwrap();
    let s = if causal { s.causal_mask().unwrap() } else { s };
    s.softmax().unwrap().dropout(p).unwrap().matmul(v).unwrap()
}

/// Output and the gradients of q, k, v of L = Σ r ⊙ attn(q, k, v) with fixed weights r.
fn run(
    device: &Device,
    shape: &[usize],
    dtype: DType,
    data: &[Vec<f32>; 3],
    fused: bool,
    causal: bool,
    p: f32,
) -> [Vec<f32>; 4] {
    let mk = |d: &[f32]| {
        Tensor::from_f32(device, shape, d, dtype, Category::Input, None)
            .unwrap()
            .track()
    };
    let (q, k, v) = (mk(&data[0]), mk(&data[1]), mk(&data[2]));
    let n: usize = shape.iter().product();
    let r = Tensor::from_f32(
        device,
        shape,
        &values(n, 99, -1.0, 1.0),
        dtype,
        Category::Input,
        None,
    )
    .unwrap();
    let scale = 1.0 / (shape[3] as f32).sqrt();
    rng::manual_seed(7);
    let tape = Tape::new();
    let (out, loss) = tape
        .record(|| {
            let out = if fused {
                Tensor::attention(&q, &k, &v, causal, scale, p)?
            } else {
                naive(&q, &k, &v, causal, scale, p)
            };
            let loss = out.mul(&r)?.cast(DType::F32)?.sum_all()?;
            Ok::<_, TensorError>((out, loss))
        })
        .unwrap();
    assert_eq!(out.dtype(), dtype);
    assert_eq!(out.shape(), shape);
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let g = |t: &Tensor| grads.get(t).unwrap().to_vec_f32().unwrap();
    [out.to_vec_f32().unwrap(), g(&q), g(&k), g(&v)]
}

fn inputs(shape: &[usize], seed: u64, dtype: DType) -> [Vec<f32>; 3] {
    let n: usize = shape.iter().product();
    let device = device();
    [0, 1, 2].map(|i| {
        let raw = values(n, seed + i, -2.0, 2.0);
        // Rounded through `dtype`, so an f32 reference sees exactly the 16-bit values.
        Tensor::from_f32(&device, &[n], &raw, dtype, Category::Input, None)
            .unwrap()
            .to_vec_f32()
            .unwrap()
    })
}

/// max |got − want| / max(max |want|, 1). The floor of 1 is the scale of the terms summed
/// here (inputs in [−2, 2], weights r in [−1, 1]): a reference that vanishes by cancellation
/// (T = 1 gives dq = 0 exactly, while the fused kernel's dP − D leaves ~1e-7) is judged
/// against it rather than against zero.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()))
        / scale
}

const NAMES: [&str; 4] = ["out", "dq", "dk", "dv"];

#[test]
fn fused_matches_the_naive_composition_in_f32_for_ragged_lengths() {
    let device = device();
    // T around and across the tile (1, 37 < 64 < 100 < 128 < 130), D = 8 and 32, B·H = 6.
    for t in [1, 37, 100, 130] {
        for d in [8, 32] {
            for causal in [true, false] {
                let shape = [2, 3, t, d];
                let data = inputs(&shape, (t * d) as u64, DType::F32);
                let fused = run(&device, &shape, DType::F32, &data, true, causal, 0.0);
                let plain = run(&device, &shape, DType::F32, &data, false, causal, 0.0);
                for (i, name) in NAMES.iter().enumerate() {
                    let err = rel_err(&fused[i], &plain[i]);
                    assert!(err <= 1e-5, "T={t} D={d} causal={causal} {name}: {err}");
                }
            }
        }
    }
    const { assert!(130 > 2 * TILE && 100 % TILE != 0) };
}

#[test]
fn fused_dropout_draws_the_masks_of_dropout_on_the_materialised_probabilities() {
    // Same seed: the fused op reserves B·H·T·T counters and indexes them as (b, h, i, j), exactly
    // as `dropout` on the contiguous (B, H, T, T) probabilities does, so both drop the same
    // entries and agree within the f32 tolerance, forward and backward.
    let device = device();
    for (t, causal) in [(37, true), (100, false), (130, true)] {
        let shape = [1, 2, t, 16];
        let data = inputs(&shape, 3, DType::F32);
        let fused = run(&device, &shape, DType::F32, &data, true, causal, 0.25);
        let plain = run(&device, &shape, DType::F32, &data, false, causal, 0.25);
        for (i, name) in NAMES.iter().enumerate() {
            let err = rel_err(&fused[i], &plain[i]);
            assert!(err <= 1e-5, "T={t} causal={causal} {name}: {err}");
        }
        // Dropout did act: without it the output differs.
        let undropped = run(&device, &shape, DType::F32, &data, true, causal, 0.0);
        assert!(rel_err(&fused[0], &undropped[0]) > 1e-2);
    }
}

#[test]
fn bf16_and_f16_are_within_their_tolerance_of_f32() {
    let device = device();
    for (dtype, tol) in [(DType::BF16, 0.016), (DType::F16, 0.002)] {
        for causal in [true, false] {
            let shape = [2, 2, 100, 32];
            let data = inputs(&shape, 11, dtype);
            let low = run(&device, &shape, dtype, &data, true, causal, 0.0);
            let f32_ref = run(&device, &shape, DType::F32, &data, false, causal, 0.0);
            for (i, name) in NAMES.iter().enumerate() {
                let err = rel_err(&low[i], &f32_ref[i]);
                assert!(err <= tol, "{dtype} causal={causal} {name}: {err}");
            }
        }
    }
}

#[test]
fn gradients_match_central_finite_differences() {
    // B = 1, H = 2, T = 5, D = 4; the check resets the RNG cursor before every evaluation, so
    // the dropout case sees one fixed mask.
    let ins = [
        input(&[1, 2, 5, 4], 1, -1.0, 1.0),
        input(&[1, 2, 5, 4], 2, -1.0, 1.0),
        input(&[1, 2, 5, 4], 3, -1.0, 1.0),
    ];
    for (causal, p) in [(true, 0.0), (false, 0.0), (true, 0.3)] {
        check_grads(
            &ins,
            |t| Tensor::attention(&t[0], &t[1], &t[2], causal, 0.7, p),
            1e-2,
            2e-3,
            1e-2,
        );
    }
}

#[test]
fn single_key_attention_returns_the_value_row() {
    // With T = 1 the only probability is 1, so out = v whatever q and k are; causal row 0 of
    // any T likewise attends only to key 0, so out[.., 0, :] = v[.., 0, :].
    let device = device();
    let q = tensor(&device, &[1, 1, 1, 3], &[5.0, -1.0, 2.0]);
    let k = tensor(&device, &[1, 1, 1, 3], &[0.5, 0.5, 0.5]);
    let v = tensor(&device, &[1, 1, 1, 3], &[1.0, 2.0, 3.0]);
    let out = Tensor::attention(&q, &k, &v, true, 1.0, 0.0).unwrap();
    assert_eq!(out.to_vec_f32().unwrap(), vec![1.0, 2.0, 3.0]);
    // Two positions with q = 1 and keys 0 and ln 3 (scale 1): scores [0, ln 3], so
    // p = [1/4, 3/4] and, with values [1, 5], out = ¼·1 + ¾·5 = 4 for both rows non-causal;
    // causal, row 0 sees only key 0 (out = 1) and row 1 both (out = 4).
    let q = tensor(&device, &[1, 1, 2, 1], &[1.0, 1.0]);
    let k = tensor(&device, &[1, 1, 2, 1], &[0.0, 3f32.ln()]);
    let v = tensor(&device, &[1, 1, 2, 1], &[1.0, 5.0]);
    for (causal, want) in [(false, [4.0, 4.0]), (true, [1.0, 4.0])] {
        let out = Tensor::attention(&q, &k, &v, causal, 1.0, 0.0).unwrap();
        let out = out.to_vec_f32().unwrap();
        assert!(
            (out[0] - want[0]).abs() < 1e-5 && (out[1] - want[1]).abs() < 1e-5,
            "causal={causal}: {out:?}"
        );
    }
}

fn block(bytes: usize) -> i64 {
    (bytes.div_ceil(512) * 512) as i64
}

/// Activation bytes held after forward and the peak bytes above the start during
/// forward + backward, for T = 1024, B·H = 1, D = 16 in f32.
fn memory_of(fused: bool) -> (i64, i64) {
    const T: usize = 1024;
    const D: usize = 16;
    let device = device();
    let shape = [1, 1, T, D];
    let leaf = |seed| tensor(&device, &shape, &values(T * D, seed, -1.0, 1.0)).track();
    let (xq, xk, xv) = (leaf(1), leaf(2), leaf(3));
    let r = tensor(&device, &shape, &values(T * D, 4, -1.0, 1.0));
    let start = device.stats().allocated_bytes.all.current;
    device.reset_peak_stats();
    let tape = Tape::new();
    let loss = tape
        .record(|| {
            // q, k, v as op outputs (activations), as they are in a model.
            let (q, k, v) = (xq.scale(1.0)?, xk.scale(1.0)?, xv.scale(1.0)?);
            let out = if fused {
                Tensor::attention(&q, &k, &v, true, 0.25, 0.0)?
            } else {
                naive(&q, &k, &v, true, 0.25, 0.0)
            };
            out.mul(&r)?.sum_all()
        })
        .unwrap();
    let held = device.stats().category_bytes[Category::Activation.index()].current;
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let peak = device.stats().allocated_bytes.all.peak - start;
    (held, peak)
}

#[test]
fn fused_forward_saves_only_q_k_v_out_and_lse_and_never_allocates_t_by_t() {
    const T: usize = 1024;
    const D: usize = 16;
    let (held, peak) = memory_of(true);
    // Saved by the fused op: q, k, v (the scale outputs; scale saves nothing) and o, each
    // (1, 1, 1024, 16) f32 = 65536 bytes (a multiple of 512), plus lse (1, 1, 1024) f32 = 4096
    // bytes; the loss is a () f32 held by the caller (512). Σ r ⊙ out saves only r (an input).
    let expected = 4 * block(T * D * 4) + block(T * 4) + block(4);
    assert_eq!(expected, 4 * 65536 + 4096 + 512);
    assert_eq!(held, expected);
    // One T×T f32 tensor is 4 MiB; the fused op's whole forward + backward stays below that
    // (activations, gradients of q, k, v and the leaves, per-lane tile scratch, D = dO·O).
    let t_by_t = (T * T * 4) as i64;
    assert!(peak < t_by_t, "peak {peak} ≥ one T×T f32 tensor ({t_by_t})");
    // The naive composition holds the (T, T) probabilities after forward and more at its peak.
    let (naive_held, naive_peak) = memory_of(false);
    assert!(naive_held >= t_by_t, "{naive_held}");
    assert!(naive_peak >= 2 * t_by_t, "{naive_peak}");
}

#[test]
fn results_are_bitwise_identical_across_runs_and_thread_counts() {
    let shape = [2, 2, 130, 16];
    let data = inputs(&shape, 21, DType::F32);
    let go = || run(&device(), &shape, DType::F32, &data, true, true, 0.1);
    let bits = |r: &[Vec<f32>; 4]| {
        r.iter()
            .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    };
    let one = pool(1).install(go);
    let two = pool(2).install(go);
    let three = pool(3).install(go);
    assert_eq!(bits(&one), bits(&two));
    assert_eq!(bits(&one), bits(&three));
    assert_eq!(bits(&go()), bits(&go()));
}

#[test]
fn shape_only_dry_run_allocates_what_the_real_run_does() {
    let run_on = |device: &Device| -> (i64, i64) {
        let mk = |_| {
            Tensor::zeros(device, &[2, 4, 200, 32], DType::BF16, Category::Input, None)
                .unwrap()
                .track()
        };
        let (q, k, v) = (mk(0), mk(1), mk(2));
        let tape = Tape::new();
        let loss = tape
            .record(|| {
                Tensor::attention(&q, &k, &v, true, 0.5, 0.1)?
                    .cast(DType::F32)?
                    .sum_all()
            })
            .unwrap();
        let held = device.stats().category_bytes[Category::Activation.index()].current;
        let mut grads = Gradients::new();
        tape.backward(&loss, &mut grads).unwrap();
        (
            held,
            device.stats().category_bytes[Category::Gradient.index()].current,
        )
    };
    let real = run_on(&device());
    let dry = run_on(&Device::shape_only(256 << 20, AllocatorConfig::default()));
    assert_eq!(real, dry);
    assert!(real.0 > 0 && real.1 > 0);
}

#[test]
fn bad_inputs_are_typed_errors() {
    let device = device();
    let t = |shape: &[usize]| {
        let n = shape.iter().product();
        tensor(&device, shape, &values(n, 1, -1.0, 1.0))
    };
    let (a, b) = (t(&[1, 2, 5, 4]), t(&[1, 2, 6, 4]));
    assert!(matches!(
        Tensor::attention(&a, &b, &a, true, 1.0, 0.0),
        Err(TensorError::ShapeMismatch {
            op: "attention",
            ..
        })
    ));
    assert!(matches!(
        Tensor::attention(
            &t(&[2, 5, 4]),
            &t(&[2, 5, 4]),
            &t(&[2, 5, 4]),
            true,
            1.0,
            0.0
        ),
        Err(TensorError::InvalidArgument {
            op: "attention",
            ..
        })
    ));
    for p in [1.0, -0.1, f32::NAN] {
        assert!(matches!(
            Tensor::attention(&a, &a, &a, true, 1.0, p),
            Err(TensorError::InvalidArgument { .. })
        ));
    }
    let half = a.cast(DType::BF16).unwrap();
    assert!(matches!(
        Tensor::attention(&a, &half, &a, true, 1.0, 0.0),
        Err(TensorError::DTypeMismatch { .. })
    ));
    let ints = Tensor::zeros(&device, &[1, 2, 5, 4], DType::I64, Category::Input, None).unwrap();
    assert!(matches!(
        Tensor::attention(&ints, &ints, &ints, true, 1.0, 0.0),
        Err(TensorError::UnsupportedDType { .. })
    ));
}
