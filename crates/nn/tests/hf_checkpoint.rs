//! Hugging Face model directories read and written: the checkpoints of the parity fixtures
//! (written by transformers' `save_pretrained`, `scripts/llama-fixtures.py`) load through
//! `HfCheckpoint` and write back unchanged; shards listed by an index load as one file does;
//! the PEFT export is the engine's adapters transposed into `nn.Linear`'s layout; the merged
//! model computes the adapted model's loss; and each broken directory gets an error naming the
//! file and the tensor.

use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::checkpoint::{HfCheckpoint, NamedTensor, Pretrained, write_hf_dir};
use headroom_nn::models::llama::{Llama, LlamaConfig};
use headroom_nn::{HuggingFace, Model, Recompute};
use headroom_strategy::{BaseWeights, Lora};
use headroom_tensor::{DType, Tensor};
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

fn fixture(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/llama/{family}"))
}

fn device() -> Device {
    Device::cpu(64 << 20, AllocatorConfig::default())
}

fn config(dir: &Path, lora: Option<Lora>) -> LlamaConfig {
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let mut c = LlamaConfig::from_hf_json(&text).unwrap();
    c.lora = lora;
    c
}

/// Every tensor of a safetensors file as (name, shape, f32 values), by name.
fn tensors_of(path: &Path) -> Vec<NamedTensor> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<NamedTensor> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| NamedTensor {
            name,
            shape: view.shape().to_vec(),
            values: view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn loaded(dir: &Path, lora: Option<Lora>, device: &Device) -> Llama {
    let mut model = Llama::new("m", config(dir, lora), device, DType::F32, 7).unwrap();
    model
        .load(&Pretrained::Dir(HfCheckpoint::open(dir).unwrap()))
        .unwrap();
    model
}

fn base_values(model: &Llama) -> Vec<Vec<f32>> {
    model
        .base_blocks()
        .iter()
        .map(|b| b.flat().to_vec_f32().unwrap())
        .collect()
}

#[test]
fn each_family_writes_back_the_checkpoint_it_loaded() {
    for family in ["llama", "mistral", "qwen2"] {
        let dir = fixture(family);
        let model = loaded(&dir, None, &device());
        let mut written = model.state(&base_values(&model)).unwrap();
        written.sort_by(|a, b| a.name.cmp(&b.name));
        // Bit for bit: loading transposes the linear weights, writing transposes them back.
        assert_eq!(
            written,
            tensors_of(&dir.join("model.safetensors")),
            "{family}"
        );
    }
}

#[test]
fn the_written_config_reads_back_to_the_same_model() {
    for family in ["llama", "mistral", "qwen2"] {
        let c = config(&fixture(family), None);
        let again = LlamaConfig::from_hf_json(&c.to_hf_json()).unwrap();
        assert_eq!(again, c, "{family}");
    }
}

#[test]
fn shards_listed_by_an_index_load_as_one_file_does() {
    let src = fixture("qwen2");
    let tmp = tempfile::tempdir().unwrap();
    let all = tensors_of(&src.join("model.safetensors"));
    // Two shards: the embedding and the first layer, then the rest.
    let (first, second): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|t| t.name.contains("embed") || t.name.contains("layers.0."));
    let mut map = serde_json::Map::new();
    for (file, part) in [("a.safetensors", &first), ("b.safetensors", &second)] {
        write_hf_dir(tmp.path(), "{}", part, None).unwrap();
        std::fs::rename(tmp.path().join("model.safetensors"), tmp.path().join(file)).unwrap();
        for t in part {
            map.insert(t.name.clone(), file.into());
        }
    }
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let device = device();
    let sharded = loaded(tmp.path(), None, &device);
    let single = loaded(&src, None, &device);
    assert_eq!(base_values(&sharded), base_values(&single));

    std::fs::remove_file(tmp.path().join("b.safetensors")).unwrap();
    let e = HfCheckpoint::open(tmp.path()).unwrap_err().to_string();
    assert!(
        e.contains("b.safetensors") && e.contains("missing") && e.contains("model."),
        "{e}"
    );
}

#[test]
fn broken_directories_are_named_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let e = HfCheckpoint::open(tmp.path()).unwrap_err().to_string();
    assert!(e.contains("no config.json"), "{e}");

    let src = fixture("llama");
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    std::fs::write(tmp.path().join("pytorch_model.bin"), b"pickle").unwrap();
    let e = HfCheckpoint::open(tmp.path()).unwrap_err().to_string();
    assert!(e.contains("safe_serialization=True"), "{e}");

    // A truncated download.
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    std::fs::write(
        tmp.path().join("model.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let e = HfCheckpoint::open(tmp.path()).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("not a safetensors file"),
        "{e}"
    );

    // Weights of another shape than config.json says: the first tensor that differs is named.
    std::fs::write(tmp.path().join("model.safetensors"), &bytes).unwrap();
    let text = std::fs::read_to_string(src.join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["intermediate_size"] = 96.into();
    std::fs::write(tmp.path().join("config.json"), v.to_string()).unwrap();
    let mut model = Llama::new("m", config(tmp.path(), None), &device(), DType::F32, 0).unwrap();
    let e = model
        .load(&Pretrained::Dir(HfCheckpoint::open(tmp.path()).unwrap()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.safetensors")
            && e.contains("model.layers.0.mlp.gate_proj.weight")
            && e.contains("[128, 64]")
            && e.contains("[96, 64]"),
        "{e}"
    );
}

fn lora(rank: usize, targets: &str) -> Lora {
    Lora::new(
        rank,
        2.0 * rank as f32,
        targets.parse().unwrap(),
        BaseWeights::Plain,
    )
    .unwrap()
}

/// Adapter values with no zero and no symmetry: element j of block i is 0.01·(1 + (7i + 3j) mod 23).
fn adapter_values(model: &Llama) -> Vec<Vec<f32>> {
    model
        .blocks()
        .iter()
        .enumerate()
        .map(|(i, b)| {
            (0..b.numel())
                .map(|j| 0.01 * (1 + (7 * i + 3 * j) % 23) as f32)
                .collect()
        })
        .collect()
}

#[test]
fn peft_tensors_are_the_adapters_in_linear_layout() {
    let model = loaded(
        &fixture("llama"),
        Some(lora(2, "q_proj,down_proj")),
        &device(),
    );
    let values = adapter_values(&model);
    let (config, tensors) = model.adapters("base", &values).unwrap().unwrap();
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["r"], 2);
    assert_eq!(config["lora_alpha"], 4.0);
    assert_eq!(
        config["target_modules"],
        serde_json::json!(["q_proj", "down_proj"])
    );
    // 2 layers × 2 targets × (A, B).
    assert_eq!(tensors.len(), 8);
    // Layer 1's block: q's A (64 × 2) then B (2 × 64), then down's A (128 × 2) and B (2 × 64).
    // PEFT's lora_A.weight is A transposed (r × in): its [k][i] is A[i][k] = values[i·r + k].
    let v = &values[1];
    let a = tensors
        .iter()
        .find(|t| t.name == "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight")
        .unwrap();
    assert_eq!(a.shape, vec![2, 128]);
    let down_a = 64 * 2 + 2 * 64;
    for (i, k) in [(0, 0), (5, 1), (127, 1)] {
        assert_eq!(a.values[k * 128 + i], v[down_a + i * 2 + k], "A[{i}][{k}]");
    }
    // lora_B.weight is B transposed (out × r): its [o][k] is B[k][o].
    let b = tensors
        .iter()
        .find(|t| t.name == "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight")
        .unwrap();
    assert_eq!(b.shape, vec![64, 2]);
    let q_b = 64 * 2;
    for (o, k) in [(0, 0), (9, 1), (63, 0)] {
        assert_eq!(b.values[o * 2 + k], v[q_b + k * 64 + o], "B[{k}][{o}]");
    }
}

fn loss(model: &Llama, device: &Device) -> f32 {
    let ids: Vec<i64> = (0..32).map(|t| (t * 37 + 11) % 256).collect();
    let x = Tensor::from_i64(device, &[2, 16], &ids, DType::I64, Category::Input, None).unwrap();
    let y: Vec<i64> = ids.iter().map(|t| (t * 5 + 1) % 256).collect();
    let y = Tensor::from_i64(device, &[2, 16], &y, DType::I64, Category::Input, None).unwrap();
    model
        .loss(&x, &y, &Recompute::none())
        .unwrap()
        .to_vec_f32()
        .unwrap()[0]
}

#[test]
fn the_merged_model_computes_the_adapted_models_loss() {
    let device = device();
    let adapted = loaded(&fixture("mistral"), Some(lora(4, "all-linear")), &device);
    let values = adapter_values(&adapted);
    for (block, v) in adapted.blocks().iter().zip(&values) {
        block.set_values(v).unwrap();
    }
    let merged = adapted.merged_blocks(&values).unwrap().unwrap();
    let plain = Llama::new(
        "m",
        config(&fixture("mistral"), None),
        &device,
        DType::F32,
        0,
    )
    .unwrap();
    for (block, (name, v)) in plain.base_blocks().iter().zip(&merged) {
        assert_eq!(block.name(), name);
        block.set_values(v).unwrap();
    }
    let (with_adapters, folded) = (loss(&adapted, &device), loss(&plain, &device));
    let base = loss(&loaded(&fixture("mistral"), None, &device), &device);
    // The adapters move the loss; folded into the weights they move it the same way (up to
    // the order of fp32 sums).
    assert!(
        (with_adapters - base).abs() > 1e-2,
        "{with_adapters} vs {base}"
    );
    assert!(
        (with_adapters - folded).abs() <= 1e-5 * with_adapters.abs(),
        "{with_adapters} vs {folded}"
    );
}

#[test]
fn qlora_quantises_the_checkpoints_projections_and_computes_their_loss() {
    let device = device();
    let dir = fixture("qwen2");
    let qlora = Lora::new(4, 8.0, "all-linear".parse().unwrap(), BaseWeights::Nf4).unwrap();
    let model = loaded(&dir, Some(qlora), &device);
    // Seven NF4 projections per layer, two layers.
    assert_eq!(model.quantized().len(), 14);
    let zero: Vec<Vec<f32>> = model
        .blocks()
        .iter()
        .map(|b| vec![0.0; b.numel()])
        .collect();
    let base = model.merged_blocks(&zero).unwrap().unwrap();
    let values: Vec<Vec<f32>> = base.iter().map(|(_, v)| v.clone()).collect();
    let written = model.state(&values).unwrap();
    let original = tensors_of(&dir.join("model.safetensors"));
    for t in &written {
        let o = original.iter().find(|o| o.name == t.name).unwrap();
        if t.name.ends_with("_proj.weight") {
            // Quantised in the engine's in × out layout, 64 values to a block (the reference:
            // the tensor crate's NF4 codec, tested against bitsandbytes' code book).
            let (out, inp) = (o.shape[0], o.shape[1]);
            let engine: Vec<f32> = (0..inp * out)
                .map(|k| o.values[(k % out) * inp + k / out])
                .collect();
            let bytes = headroom_tensor::nf4::quantize_nf4(&engine);
            let mut round = vec![0f32; engine.len()];
            headroom_tensor::nf4::dequantize_nf4(&bytes, engine.len(), |j, v| round[j] = v);
            let want: Vec<f32> = (0..out * inp)
                .map(|k| round[(k % inp) * out + k / inp])
                .collect();
            assert_eq!(t.values, want, "{}", t.name);
            assert_ne!(t.values, o.values, "{}: NF4 is lossy", t.name);
        } else {
            assert_eq!(t.values, o.values, "{}: kept as it was", t.name);
        }
    }
    // The QLoRA model computes the loss of a plain LoRA model on the dequantised base.
    let adapters = adapter_values(&model);
    for (block, v) in model.blocks().iter().zip(&adapters) {
        block.set_values(v).unwrap();
    }
    let plain = Lora::new(4, 8.0, "all-linear".parse().unwrap(), BaseWeights::Plain).unwrap();
    let reference = Llama::new("m", config(&dir, Some(plain)), &device, DType::F32, 7).unwrap();
    for (block, v) in reference.base_blocks().iter().zip(&values) {
        block.set_values(v).unwrap();
    }
    for (block, v) in reference.blocks().iter().zip(&adapters) {
        block.set_values(v).unwrap();
    }
    let (q, r) = (loss(&model, &device), loss(&reference, &device));
    assert!((q - r).abs() <= 1e-5 * r.abs(), "{q} vs {r}");
}

#[test]
fn a_directory_of_a_family_headroom_does_not_build_names_its_config_and_type() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("config.json"),
        r#"{"model_type": "gpt_neox", "hidden_size": 64}"#,
    )
    .unwrap();
    let name = tmp.path().display().to_string();
    let e = headroom_nn::models::ModelSpec::resolve(&name)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("config.json")
            && e.contains("'gpt_neox'")
            && e.contains("llama, mistral, qwen2"),
        "{e}"
    );
}
