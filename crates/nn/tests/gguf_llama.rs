//! A GGUF Llama read as the Hugging Face checkpoint it was converted from. tiny-llama.gguf was
//! converted by scripts/gguf-fixtures.py with gguf-py and llama.cpp's q/k permutation;
//! tiny-llama.safetensors holds the Hugging Face tensors before conversion (exact for the F32
//! tensors, gguf-py's quantise-dequantise round trip of the unpermuted weights for the
//! quantised ones) and tiny-llama.config.json the Hugging Face config.

use crate::gguf_common;

use gguf_common::{assert_bitwise, fixture, reference};
use headroom_memory::{AllocatorConfig, Device};
use headroom_nn::checkpoint::gguf::{GgufError, GgufFile, gguf_name, unpermute_rows};
use headroom_nn::models::llama::{HfTensor, Llama, LlamaConfig};
use headroom_tensor::DType;
use std::collections::BTreeSet;

fn tiny() -> GgufFile {
    GgufFile::open(fixture("tiny-llama.gguf")).unwrap()
}

#[test]
fn the_configuration_equals_the_converted_models() {
    let got = tiny().llama_config().unwrap();
    let text = std::fs::read_to_string(fixture("tiny-llama.config.json")).unwrap();
    assert_eq!(got, LlamaConfig::from_hf_json(&text).unwrap());
    // The script's model: 2 layers, width 32, 4 heads, 2 KV heads, ffn 64, 3 specials + 256
    // bytes + 9 merges = 268 tokens, biases on q/k/v/o, an output.weight (untied).
    let shape = (
        got.layers,
        got.width,
        got.heads,
        got.kv_heads,
        got.ffn,
        got.vocab,
    );
    assert_eq!(shape, (2, 32, 4, 2, 64, 268));
    assert!(!got.tied && got.qkv_bias && got.o_bias && !got.mlp_bias);
    assert_eq!(
        (got.rope_theta, got.rms_eps, got.context),
        (100_000.0, 1e-5, 128)
    );
}

#[test]
fn every_hugging_face_tensor_equals_the_reference() {
    let file = tiny();
    let expected = reference("tiny-llama.safetensors");
    // Embedding, 2 × 13 layer tensors, final norm, head.
    assert_eq!(expected.len(), 29);
    for (name, shape, want) in &expected {
        let (got_shape, got) = file.hf_tensor_named(name).unwrap();
        assert_eq!(&got_shape, shape, "{name}");
        assert_bitwise(&got, want, name);
    }
}

#[test]
fn q_and_k_are_stored_permuted_and_given_back_unpermuted() {
    let file = tiny();
    let expected = reference("tiny-llama.safetensors");
    for (name, gguf) in [
        (
            "model.layers.0.self_attn.q_proj.weight",
            "blk.0.attn_q.weight",
        ),
        ("model.layers.0.self_attn.k_proj.bias", "blk.0.attn_k.bias"),
    ] {
        let (_, _, want) = expected.iter().find(|(n, _, _)| n == name).unwrap();
        // The stored rows are a different order of the same values: the permutation is real.
        let stored = file.tensor_f32(gguf).unwrap();
        assert_ne!(&stored, want, "{gguf} is stored permuted");
        let (mut a, mut b) = (stored.clone(), want.clone());
        a.sort_by(f32::total_cmp);
        b.sort_by(f32::total_cmp);
        assert_eq!(a, b);
    }
}

#[test]
fn unpermuting_inverts_llama_cpps_permutation() {
    // One head of 4 rows (2 pairs): permute gives w.reshape(1, 2, 2).swapaxes(1, 2), i.e.
    // stored row 2i + s holds Hugging Face row 2s + i: stored = [r0, r2, r1, r3].
    let stored = [0.0, 0.5, 2.0, 2.5, 1.0, 1.5, 3.0, 3.5]; // 4 rows of 2 columns
    let hf = unpermute_rows(&stored, 4, 1);
    assert_eq!(hf, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]);
    // Two heads of 4: each head is unpermuted on its own.
    let stored = [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0];
    assert_eq!(
        unpermute_rows(&stored, 8, 2),
        [0., 1., 2., 3., 4., 5., 6., 7.]
    );
}

#[test]
fn hugging_face_names_map_to_llama_cpps() {
    let cases = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        (
            "model.layers.7.self_attn.q_proj.weight",
            "blk.7.attn_q.weight",
        ),
        ("model.layers.0.self_attn.k_proj.bias", "blk.0.attn_k.bias"),
        (
            "model.layers.1.self_attn.o_proj.weight",
            "blk.1.attn_output.weight",
        ),
        (
            "model.layers.2.mlp.gate_proj.weight",
            "blk.2.ffn_gate.weight",
        ),
        (
            "model.layers.2.mlp.down_proj.weight",
            "blk.2.ffn_down.weight",
        ),
        (
            "model.layers.3.input_layernorm.weight",
            "blk.3.attn_norm.weight",
        ),
        (
            "model.layers.3.post_attention_layernorm.weight",
            "blk.3.ffn_norm.weight",
        ),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    for (hf, gguf) in cases {
        assert_eq!(gguf_name(hf).as_deref(), Some(gguf), "{hf}");
    }
    assert_eq!(gguf_name("model.layers.x.mlp.up_proj.weight"), None);
    assert_eq!(gguf_name("model.layers.0.mlp.act_fn.weight"), None);
}

#[test]
fn the_engines_llama_loads_every_tensor_from_the_file() {
    let file = tiny();
    let device = Device::cpu(64 << 20, AllocatorConfig::default());
    let mut model =
        Llama::new("tiny", file.llama_config().unwrap(), &device, DType::F32, 0).unwrap();
    let wanted: BTreeSet<String> = model.hf_tensors().into_iter().map(|t| t.name).collect();
    let reference: BTreeSet<String> = reference("tiny-llama.safetensors")
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    assert_eq!(wanted, reference);
    model.load_hf(file.hf_loader()).unwrap();
}

#[test]
fn a_shape_the_configuration_does_not_expect_names_the_tensor() {
    let file = tiny();
    let tensor = HfTensor {
        name: "model.layers.1.mlp.up_proj.weight".into(),
        block: 2,
        slot: "mlp.up_proj.weight".into(),
        offset: 0,
        shape: vec![32, 64],
        transposed: true,
    };
    let err = file.hf_tensor(&tensor).unwrap_err();
    assert!(
        matches!(&err, GgufError::ShapeMismatch { tensor, found, .. }
        if tensor == "blk.1.ffn_up.weight" && found == &vec![64, 32])
    );
}

#[test]
fn the_config_json_is_what_transformers_reads() {
    let json: serde_json::Value = serde_json::from_str(&tiny().hf_config_json().unwrap()).unwrap();
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tiny-llama.config.json")).unwrap())
            .unwrap();
    for (key, value) in want.as_object().unwrap() {
        assert_eq!(&json[key], value, "{key}");
    }
}

#[test]
fn the_tokenizer_document_holds_the_vocabulary_merges_and_specials() {
    let doc: serde_json::Value = serde_json::from_str(&tiny().tokenizer_json().unwrap()).unwrap();
    let model = &doc["model"];
    assert_eq!(model["type"], "BPE");
    // 3 specials, then byte b at 3 + b (' ' = 32 is 'Ġ' in GPT-2's byte table), then the
    // merges' results in order from 259: "Ġworld" is the ninth, 267.
    let vocab = model["vocab"].as_object().unwrap();
    assert_eq!(vocab.len(), 268);
    assert_eq!(
        (vocab["Ġ"].as_u64(), vocab["a"].as_u64()),
        (Some(35), Some(100))
    );
    assert_eq!(vocab["Ġworld"].as_u64(), Some(267));
    assert_eq!(model["merges"].as_array().unwrap().len(), 9);
    assert_eq!(model["merges"][0], "h e");
    let added = doc["added_tokens"].as_array().unwrap();
    let specials: Vec<_> = added
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap(),
                t["content"].as_str().unwrap(),
                t["special"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        specials,
        [
            (0, "<|endoftext|>", true),
            (1, "<|im_start|>", true),
            (2, "<|im_end|>", true)
        ]
    );
    let pre = &doc["pre_tokenizer"]["pretokenizers"];
    assert_eq!(
        (
            pre[0]["type"].as_str(),
            pre[0]["individual_digits"].as_bool()
        ),
        (Some("Digits"), Some(true))
    );
    assert_eq!(
        (
            pre[1]["type"].as_str(),
            pre[1]["add_prefix_space"].as_bool()
        ),
        (Some("ByteLevel"), Some(false))
    );
    assert_eq!(doc["decoder"]["type"], "ByteLevel");
}
