//! Grouped-query attention (Ainslie et al. 2023) in the fused memory-efficient kernel: keys and
//! values of `Hkv` heads shared by groups of `H / Hkv` query heads, read in place. The
//! reference is the composition PyTorch's Llama uses (`repeat_kv` in transformers'
//! `modeling_llama.py`): each key/value head repeated for its group (`repeat_interleave` on the
//! head axis), then plain attention over `H` heads; the gradient of a shared head is the sum of
//! its copies' gradients (the repeat's backward).
//!
//! Tolerances. f32: the reference's masked softmax and products sum in other orders and tiles
//! than the fused kernel, and its dK, dV sum the group's copies after the fact where the kernel
//! accumulates them in its tile: a few ulps of the largest value, 1e-5 of it (as in
//! `attention_tests.rs`). The forward and dQ of each query head are the ungrouped kernel's own
//! arithmetic on the same numbers, so against the fused kernel over the repeated heads they are
//! equal bit for bit.

use crate::common;

use common::{device, values};
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_tensor::{DType, Gradients, Tape, Tensor, TensorError, rng};

#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// The fused kernel reading the shared heads in place.
    Grouped,
    /// The fused kernel over keys and values repeated per query head.
    FusedRepeated,
    /// The naive composition over repeated keys and values.
    NaiveRepeated,
}

/// Output and the gradients of q (B, H, T, D), k and v (B, Hkv, T, D) of
/// L = Σ r ⊙ attn(q, k, v) with fixed weights r.
fn run(
    device: &Device,
    [b, h, hkv, t, d]: [usize; 5],
    causal: bool,
    p: f32,
    path: Path,
) -> [Vec<f32>; 4] {
    let mk = |shape: &[usize], seed| {
        let n = shape.iter().product();
        Tensor::from_f32(
            device,
            shape,
            &values(n, seed, -2.0, 2.0),
            DType::F32,
            Category::Input,
            None,
        )
        .unwrap()
    };
    let (q, k, v) = (
        mk(&[b, h, t, d], 1).track(),
        mk(&[b, hkv, t, d], 2).track(),
        mk(&[b, hkv, t, d], 3).track(),
    );
    let r = mk(&[b, h, t, d], 4);
    let scale = 1.0 / (d as f32).sqrt();
    rng::manual_seed(5);
    let tape = Tape::new();
    let (out, loss) = tape
        .record(|| {
            let out = if path == Path::Grouped {
                Tensor::attention(&q, &k, &v, causal, scale, p)?
            } else {
                let (k, v) = (
                    k.repeat_interleave(1, h / hkv)?,
                    v.repeat_interleave(1, h / hkv)?,
                );
                if path == Path::FusedRepeated {
                    Tensor::attention(&q, &k, &v, causal, scale, p)?
                } else {
                    let s = q.matmul(&k.transpose(-1, -2)?)?.scale(scale)?;
                    let s = if causal { s.causal_mask()? } else { s };
                    s.softmax()?.dropout(p)?.matmul(&v)?
                }
            };
            let loss = out.mul(&r)?.sum_all()?;
            Ok::<_, TensorError>((out, loss))
        })
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let g = |x: &Tensor| grads.get(x).unwrap().to_vec_f32().unwrap();
    [out.to_vec_f32().unwrap(), g(&q), g(&k), g(&v)]
}

/// max |got − want| / max(max |want|, 1) (see `attention_tests.rs` for the floor).
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()))
        / scale
}

const NAMES: [&str; 4] = ["out", "dq", "dk", "dv"];

#[test]
fn grouped_heads_match_attention_over_repeated_keys_and_values() {
    let device = device();
    // 6 query heads over 2 (groups of 3), 3 (pairs) and 1 (multi-query) key/value heads; T
    // within one 64-key tile, across two and ragged; with and without the causal mask and
    // dropout (its mask is drawn per query head, (b, h, i, j), as on the repeated heads).
    for (hkv, t, causal, p) in [
        (2, 37, true, 0.0),
        (3, 130, true, 0.0),
        (1, 100, false, 0.0),
        (2, 130, true, 0.25),
    ] {
        let dims = [2, 6, hkv, t, 16];
        let grouped = run(&device, dims, causal, p, Path::Grouped);
        let naive = run(&device, dims, causal, p, Path::NaiveRepeated);
        for (i, name) in NAMES.iter().enumerate() {
            let err = rel_err(&grouped[i], &naive[i]);
            assert!(
                err <= 1e-5,
                "Hkv={hkv} T={t} causal={causal} p={p} {name}: {err}"
            );
        }
        let fused = run(&device, dims, causal, p, Path::FusedRepeated);
        for i in 0..2 {
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&grouped[i]),
                bits(&fused[i]),
                "Hkv={hkv} T={t} {}",
                NAMES[i]
            );
        }
        // The shared heads' gradients are sums over 6 / Hkv query heads: not one copy's.
        assert!(rel_err(&grouped[2], &fused[2]) <= 1e-5);
    }
}

#[test]
fn grouped_results_are_bitwise_identical_across_thread_counts() {
    // dK and dV tasks own a key block of one key/value head and sum its group's query heads in
    // a fixed order, so no thread count changes a bit.
    let go = || run(&device(), [2, 4, 2, 130, 16], true, 0.1, Path::Grouped);
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    };
    let bits = |r: &[Vec<f32>; 4]| {
        r.iter()
            .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    let one = pool(1).install(go);
    assert_eq!(bits(&one), bits(&pool(2).install(go)));
    assert_eq!(bits(&one), bits(&pool(3).install(go)));
}

#[test]
fn grouped_attention_saves_the_shared_heads_once() {
    // B = 1, H = 4 over Hkv = 1, T = 128, D = 16, f32: the op saves q (4·128·16·4 = 32 KiB),
    // k and v (8 KiB each, not 32 KiB as repeated copies), the output (32 KiB) and lse
    // (4·128·4 = 2 KiB); every size is a multiple of the allocator's 512-byte block. q, k and v
    // are op outputs (activations), as in a model; the loss is a () f32 (one 512-byte block).
    let device = device();
    let leaf = |shape: &[usize], seed| {
        let n = shape.iter().product();
        Tensor::from_f32(
            &device,
            shape,
            &values(n, seed, -1.0, 1.0),
            DType::F32,
            Category::Input,
            None,
        )
        .unwrap()
        .track()
    };
    let (xq, xk, xv) = (
        leaf(&[1, 4, 128, 16], 1),
        leaf(&[1, 1, 128, 16], 2),
        leaf(&[1, 1, 128, 16], 3),
    );
    let tape = Tape::new();
    let _loss = tape
        .record(|| {
            let (q, k, v) = (xq.scale(1.0)?, xk.scale(1.0)?, xv.scale(1.0)?);
            Tensor::attention(&q, &k, &v, true, 0.25, 0.0)?.sum_all()
        })
        .unwrap();
    let held = device.stats().category_bytes[Category::Activation.index()].current;
    assert_eq!(held, 32768 + 2 * 8192 + 32768 + 2048 + 512);
}

#[test]
fn shape_only_dry_run_allocates_what_the_grouped_real_run_does() {
    let run_on = |device: &Device| -> (i64, i64, i64) {
        let mk = |heads, _| {
            Tensor::zeros(
                device,
                &[2, heads, 200, 32],
                DType::BF16,
                Category::Input,
                None,
            )
            .unwrap()
            .track()
        };
        let (q, k, v) = (mk(6, 0), mk(2, 1), mk(2, 2));
        device.reset_peak_stats();
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
        let stats = device.stats();
        (
            held,
            stats.category_bytes[Category::Gradient.index()].current,
            stats.allocated_bytes.all.peak,
        )
    };
    let real = run_on(&device());
    let dry = run_on(&Device::shape_only(256 << 20, AllocatorConfig::default()));
    assert_eq!(real, dry);
    assert!(real.0 > 0 && real.1 > 0);
}

#[test]
fn key_value_heads_that_do_not_divide_the_query_heads_are_refused() {
    let device = device();
    let z = |shape: &[usize]| Tensor::zeros(&device, shape, DType::F32, Category::Input, None);
    let q = z(&[1, 6, 8, 4]).unwrap();
    for (k, v) in [
        (z(&[1, 4, 8, 4]).unwrap(), z(&[1, 4, 8, 4]).unwrap()), // 4 does not divide 6
        (z(&[1, 2, 8, 4]).unwrap(), z(&[1, 3, 8, 4]).unwrap()), // k and v differ
        (z(&[1, 2, 9, 4]).unwrap(), z(&[1, 2, 9, 4]).unwrap()), // another T
    ] {
        assert!(matches!(
            Tensor::attention(&q, &k, &v, true, 1.0, 0.0),
            Err(TensorError::ShapeMismatch {
                op: "attention",
                ..
            })
        ));
    }
}
