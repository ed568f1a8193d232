//! The GPT with memory-efficient (fused) attention against the same GPT, same weights, with
//! naive attention: equal losses and gradients within f32 tolerance, with and without dropout,
//! and fewer activation bytes — the (B, H, T, T) probabilities are never saved.
//!
//! Tolerances: the two paths sum the same f32 products in different orders (the fused kernel
//! tiles keys and rescales its running sums), a few ulps per attention output; through two
//! layers and the loss that stays below 1e-5 absolute on a loss of ≈ ln 256 ≈ 5.5, and below
//! 1e-4 of the largest gradient of each parameter block.

use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::Model;
use headroom_nn::Recompute;
use headroom_nn::models::gpt::Attention;
use headroom_nn::models::{Gpt, GptConfig, ModelSpec, preset};
use headroom_tensor::{DType, Gradients, Tape, Tensor, rng};

fn config(dropout: f32, context: usize) -> GptConfig {
    let Some(ModelSpec::Gpt(mut c)) = preset("gpt-tiny") else {
        panic!("gpt-tiny is a GPT preset")
    };
    c.dropout = dropout;
    c.context = context;
    c
}

struct Outcome {
    loss: f32,
    grads: Vec<Vec<f32>>,
    /// Activation bytes held once forward is done (what the tape saved, plus the loss).
    saved: i64,
    /// Peak activation bytes during forward and backward.
    peak: i64,
}

fn step(kind: Attention, dropout: f32, b: usize, t: usize) -> Outcome {
    let device = Device::cpu(1 << 30, AllocatorConfig::default());
    let model = Gpt::new("gpt-tiny", config(dropout, t), &device, DType::F32, 11)
        .unwrap()
        .with_attention(kind);
    assert_eq!(model.attention(), kind);
    let ids = |shift: usize| {
        let v: Vec<i64> = (0..b * t)
            .map(|i| ((i * 13 + shift) % 256) as i64)
            .collect();
        Tensor::from_i64(&device, &[b, t], &v, DType::I64, Category::Input, None).unwrap()
    };
    let (x, y) = (ids(0), ids(1));
    let mut grads = Gradients::new();
    for block in model.blocks() {
        block.bind_grads(&mut grads).unwrap();
    }
    device.reset_peak_stats();
    rng::manual_seed(3);
    let tape = Tape::new();
    let loss = tape
        .record(|| model.loss(&x, &y, &Recompute::none()))
        .unwrap();
    let saved = device.stats().category_bytes[Category::Activation.index()].current;
    tape.backward(&loss, &mut grads).unwrap();
    Outcome {
        loss: loss.to_scalar_f32().unwrap(),
        grads: model
            .blocks()
            .iter()
            .map(|b| b.flat_grad().to_vec_f32().unwrap())
            .collect(),
        saved,
        peak: device.stats().category_bytes[Category::Activation.index()].peak,
    }
}

fn assert_same_training_signal(fused: &Outcome, naive: &Outcome, what: &str) {
    assert!(
        (fused.loss - naive.loss).abs() <= 1e-5,
        "{what}: loss {} vs {}",
        fused.loss,
        naive.loss
    );
    for (i, (f, n)) in fused.grads.iter().zip(&naive.grads).enumerate() {
        let scale = n.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = f.iter().zip(n).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(scale > 0.0, "{what}: block {i} has no gradient");
        assert!(
            err <= 1e-4 * scale,
            "{what}: block {i} gradient error {err} of {scale}"
        );
    }
}

#[test]
fn memory_efficient_attention_gives_the_naive_loss_and_gradients() {
    // gpt-tiny: 2 layers, width 32, 2 heads (D = 16); B = 2, T = 32.
    let naive = step(Attention::Naive, 0.0, 2, 32);
    let fused = step(Attention::MemoryEfficient, 0.0, 2, 32);
    assert_same_training_signal(&fused, &naive, "no dropout");
}

#[test]
fn with_dropout_both_kinds_drop_the_same_attention_probabilities() {
    // The fused op draws its mask at the indices dropout on the (B, H, T, T) probabilities
    // uses, from the same point of the stream, so the whole step is the same computation.
    let naive = step(Attention::Naive, 0.1, 2, 32);
    let fused = step(Attention::MemoryEfficient, 0.1, 2, 32);
    assert_same_training_signal(&fused, &naive, "dropout 0.1");
    let undropped = step(Attention::MemoryEfficient, 0.0, 2, 32);
    assert!((fused.loss - undropped.loss).abs() > 1e-4);
}

#[test]
fn memory_efficient_attention_saves_fewer_activation_bytes() {
    // Naive attention saves per layer the (B, H, T, T) f32 probabilities (one storage shared by
    // softmax and the matmul with v): 2·2·128·128·4 = 256 KiB at B = 2, T = 128. The fused op
    // saves its (B, T, C) output and a (B, H, T) f32 statistic instead (1 KiB here), and q, k, v
    // either way. So per layer at least 256 KiB − 32 KiB − 1 KiB fewer, two layers.
    let (b, t) = (2, 128);
    let naive = step(Attention::Naive, 0.0, b, t);
    let fused = step(Attention::MemoryEfficient, 0.0, b, t);
    let probs = (b * 2 * t * t * 4) as i64;
    let out = (b * t * 32 * 4) as i64;
    let lse = (b * 2 * t * 4) as i64;
    assert!(
        naive.saved - fused.saved >= 2 * (probs - out - lse),
        "saved {} (naive) vs {} (fused)",
        naive.saved,
        fused.saved
    );
    assert!(
        fused.peak < naive.peak,
        "peak {} (fused) vs {} (naive)",
        fused.peak,
        naive.peak
    );
}

#[test]
fn attention_kinds_have_kebab_case_names_and_naive_is_the_default() {
    #[derive(serde::Deserialize)]
    struct Holder {
        #[serde(default)]
        attention: Attention,
    }
    let parse = |s: &str| toml::from_str::<Holder>(s).map(|h| h.attention);
    assert_eq!(parse("attention = \"naive\"").unwrap(), Attention::Naive);
    assert_eq!(
        parse("attention = \"memory-efficient\"").unwrap(),
        Attention::MemoryEfficient
    );
    assert_eq!(parse("").unwrap(), Attention::Naive);
    assert!(parse("attention = \"flash\"").is_err());
}
