//! The Llama family against the reference implementation: for a tiny Llama, Mistral (sliding
//! window 5 over 16 positions) and Qwen2 (q/k/v biases, tied head) built by transformers from
//! a config (`scripts/llama-fixtures.py`, fp32, eager attention), the engine loads the
//! checkpoint's `config.json` and `model.safetensors` and must give the same mean cross-entropy
//! (1e-5 relative) and every parameter's gradient (max |Δ| within 1e-4 of the tensor's largest
//! magnitude), with naive and with memory-efficient attention.

use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::models::llama::{HfTensor, Llama, LlamaConfig};
use headroom_nn::{Model, Recompute};
use headroom_strategy::Attention;
use headroom_tensor::{DType, Gradients, Tape, Tensor, TensorError};
use safetensors::SafeTensors;
use std::path::PathBuf;

fn dir(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/llama/{family}"))
}

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    let t = st
        .tensor(name)
        .unwrap_or_else(|_| panic!("no tensor {name}"));
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn i64s(st: &SafeTensors, name: &str) -> Vec<i64> {
    let t = st.tensor(name).unwrap();
    t.data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The transpose of row-major (rows × cols) `x`.
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|k| x[(k % rows) * cols + k / rows])
        .collect()
}

/// Max |got − want| over the largest |want|.
fn rel(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f64, |m, (g, w)| m.max((*g as f64 - *w as f64).abs()));
    diff / scale
}

/// (loss error, worst gradient error and its tensor).
fn check(family: &str, attention: Attention, dtype: DType) -> (f64, f64, String) {
    let d = dir(family);
    let config = std::fs::read_to_string(d.join("config.json")).unwrap();
    let mut config = LlamaConfig::from_hf_json(&config).unwrap();
    config.attention = attention;
    let weights = std::fs::read(d.join("model.safetensors")).unwrap();
    let weights = SafeTensors::deserialize(&weights).unwrap();
    let expected = std::fs::read(d.join("expected.safetensors")).unwrap();
    let expected = SafeTensors::deserialize(&expected).unwrap();

    let device = Device::cpu(64 << 20, AllocatorConfig::default());
    let mut model = Llama::new(family, config, &device, dtype, 0).unwrap();
    model
        .load_hf(|t: &HfTensor| {
            let view = weights.tensor(&t.name).map_err(|_| {
                TensorError::invalid("load", format!("model.safetensors has no {}", t.name))
            })?;
            assert_eq!(view.shape(), t.shape.as_slice(), "{}", t.name);
            Ok(f32s(&weights, &t.name))
        })
        .unwrap();

    let shape = expected.tensor("input_ids").unwrap().shape().to_vec();
    let ids = |name| {
        Tensor::from_i64(
            &device,
            &shape,
            &i64s(&expected, name),
            DType::I64,
            Category::Input,
            None,
        )
        .unwrap()
    };
    let (x, y) = (ids("input_ids"), ids("labels"));
    let mut grads = Gradients::new();
    for b in model.blocks() {
        b.bind_grads(&mut grads).unwrap();
    }
    let tape = Tape::new();
    let loss = tape
        .record(|| model.loss(&x, &y, &Recompute::none()))
        .unwrap();
    tape.backward(&loss, &mut grads).unwrap();
    let got = loss.to_vec_f32().unwrap()[0] as f64;
    let want = f32s(&expected, "loss")[0] as f64;
    let loss_err = (got - want).abs() / want.abs();

    let mut worst = (0f64, String::new());
    for t in model.hf_tensors() {
        let g = model.blocks()[t.block]
            .grad(&t.slot)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        // Tied: the checkpoint has no lm_head, the embedding's gradient holds both uses.
        let want = f32s(&expected, &format!("grad.{}", t.name));
        let g = match t.transposed {
            true => transpose(&g, t.shape[1], t.shape[0]),
            false => g,
        };
        let e = rel(&g, &want);
        if e > worst.0 {
            worst = (e, t.name.clone());
        }
    }
    (loss_err, worst.0, worst.1)
}

#[test]
fn loss_and_every_gradient_match_transformers() {
    for family in ["llama", "mistral", "qwen2"] {
        for attention in [Attention::Naive, Attention::MemoryEfficient] {
            let (loss_err, grad_err, at) = check(family, attention, DType::F32);
            println!(
                "{family} {attention}: loss rel err {loss_err:.2e}, worst gradient {grad_err:.2e} ({at})"
            );
            assert!(
                loss_err <= 1e-5,
                "{family} {attention}: loss error {loss_err}"
            );
            assert!(
                grad_err <= 1e-4,
                "{family} {attention}: gradient error {grad_err} at {at}"
            );
        }
    }
}

/// bf16 (weights, activations and gradients in bf16, the loss's log-sum-exp in f32) against
/// the same fp32 reference. bf16 keeps 8 significant bits (unit roundoff u = 2⁻⁸ ≈ 3.9e-3):
/// rounding the weights alone moves each logit by about u·|logit|, and each of the ~20
/// roundings on the way adds as much, so the loss is held to 4u ≈ 1.6e-2 relative and every
/// gradient to 16u ≈ 6.3e-2 of its tensor's largest magnitude (a few ulps of error
/// accumulated along the backward chain, which is longer than the forward's).
#[test]
fn bf16_loss_and_gradients_match_transformers_within_bf16_rounding() {
    let u = 2f64.powi(-8);
    for family in ["llama", "mistral", "qwen2"] {
        for attention in [Attention::Naive, Attention::MemoryEfficient] {
            let (loss_err, grad_err, at) = check(family, attention, DType::BF16);
            println!(
                "{family} {attention} bf16: loss rel err {loss_err:.2e}, worst gradient {grad_err:.2e} ({at})"
            );
            assert!(
                loss_err <= 4.0 * u,
                "{family} {attention}: loss error {loss_err}"
            );
            assert!(
                grad_err <= 16.0 * u,
                "{family} {attention}: gradient error {grad_err} at {at}"
            );
        }
    }
}

#[test]
fn the_checkpoints_configs_are_read_as_their_families() {
    let read = |f| {
        LlamaConfig::from_hf_json(&std::fs::read_to_string(dir(f).join("config.json")).unwrap())
            .unwrap()
    };
    let (llama, mistral, qwen2) = (read("llama"), read("mistral"), read("qwen2"));
    assert_eq!(
        (llama.kv_heads, llama.heads, llama.tied, llama.qkv_bias),
        (2, 4, false, false)
    );
    assert_eq!(mistral.sliding_window, Some(5));
    assert_eq!((mistral.window(0), mistral.window(1)), (Some(5), Some(5)));
    assert_eq!(
        (qwen2.tied, qwen2.qkv_bias, qwen2.o_bias),
        (true, true, false)
    );
    assert_eq!(qwen2.rope_theta, 1_000_000.0);
}

#[test]
fn an_unsupported_model_type_names_itself_and_the_supported_ones() {
    let err = LlamaConfig::from_hf_json(r#"{"model_type": "gpt2", "hidden_size": 8}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'gpt2'") && err.contains("llama, mistral, qwen2"),
        "{err}"
    );
}
