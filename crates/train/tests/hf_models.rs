//! Runs of a Hugging Face model directory (`--model DIR`): the parity fixtures' tiny Llama,
//! Mistral and Qwen2 (transformers' `save_pretrained`, `scripts/llama-fixtures.py`) train from
//! their checkpoint's weights, the dry run predicts each run's peaks exactly, without LoRA, with
//! LoRA and with QLoRA, and `--hf-out` is refused for a model without a Hugging Face layout.

use headroom_memory::Category;
use headroom_strategy::BaseWeights;
use headroom_train::Trainer;
use headroom_train::config::TrainConfig;
use headroom_train::data::Corpus;
use headroom_train::predict::error::evaluate;
use std::path::PathBuf;

fn fixture(family: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../nn/tests/data/llama/{family}"))
        .display()
        .to_string()
}

fn run(family: &str, lora: Option<BaseWeights>, precision: &str) -> TrainConfig {
    TrainConfig {
        model: Some(fixture(family)),
        precision: Some(precision.parse().unwrap()),
        micro_batch: Some(2),
        accumulation: Some(2),
        seq_len: Some(16),
        steps: Some(2),
        eval_every: Some(0),
        eval_batches: Some(1),
        lora_rank: lora.map(|_| 4),
        lora_targets: lora.map(|_| "q_proj,v_proj,down_proj".parse().unwrap()),
        lora_base: lora,
        device_memory: Some("256MiB".parse().unwrap()),
        ..Default::default()
    }
}

#[test]
fn dry_runs_of_model_directories_equal_their_runs() {
    let corpus = Corpus::bundled();
    for family in ["llama", "mistral", "qwen2"] {
        for (lora, precision) in [
            (None, "fp32"),
            (Some(BaseWeights::Plain), "bf16-mixed"),
            (Some(BaseWeights::Nf4), "bf16-mixed"),
        ] {
            let row = evaluate(run(family, lora, precision), &corpus).unwrap();
            let (p, m) = (&row.dry_run, &row.measured);
            let label = format!("{family} lora={lora:?} {precision}");
            assert_eq!(p.peak_allocated_bytes, m.peak_allocated_bytes, "{label}");
            for cat in Category::ALL {
                assert_eq!(
                    p.peak_bytes_by_category[cat], m.peak_bytes_by_category[cat],
                    "{label}: {cat}"
                );
            }
        }
    }
}

#[test]
fn a_run_starts_from_the_checkpoints_weights_and_is_validated_first() {
    // The same seed, one run from the directory with weights and one from its config alone
    // (initialised afresh): the first validation differs, and only the pretrained start is
    // validated before step 1.
    let corpus = Corpus::bundled();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        PathBuf::from(fixture("llama")).join("config.json"),
        tmp.path().join("config.json"),
    )
    .unwrap();
    let report = |model: String| {
        let c = TrainConfig {
            model: Some(model),
            ..run("llama", None, "fp32")
        }
        .resolve()
        .unwrap();
        let mut t = Trainer::new(c, &corpus).unwrap();
        t.train(&mut |_| {}).unwrap().clone()
    };
    let pretrained = report(fixture("llama"));
    let fresh = report(tmp.path().display().to_string());
    let steps: Vec<u64> = pretrained.val_losses.iter().map(|v| v.step).collect();
    assert_eq!(steps, [0, 2]);
    let steps: Vec<u64> = fresh.val_losses.iter().map(|v| v.step).collect();
    assert_eq!(steps, [2]);
    assert_ne!(pretrained.losses[0], fresh.losses[0]);
}

#[test]
fn hf_out_is_refused_for_headroom_s_own_models() {
    let c = TrainConfig {
        model: Some("gpt-tiny".into()),
        hf_out: Some("out".into()),
        ..run("llama", None, "fp32")
    }
    .resolve()
    .unwrap();
    let e = Trainer::new(c, &Corpus::bundled()).unwrap_err().to_string();
    assert!(e.contains("--save-dir") && e.contains("gpt-tiny"), "{e}");
}

/// The GGUF fixture of `scripts/gguf-fixtures.py`: a tiny Llama (Q4_1, Q8_0 and F32 tensors)
/// with a byte-level BPE tokenizer in its metadata.
#[cfg(feature = "hf-tokenizer")]
fn gguf_fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../nn/tests/data/gguf/tiny-llama.gguf")
        .display()
        .to_string()
}

#[cfg(feature = "hf-tokenizer")]
#[test]
fn a_gguf_file_trains_with_its_own_tokenizer_and_exports_a_model_directory() {
    let corpus = Corpus::bundled();
    let c = TrainConfig {
        model: Some(gguf_fixture()),
        ..run("llama", None, "fp32")
    };
    let row = evaluate(c.clone(), &corpus).unwrap();
    assert_eq!(
        row.dry_run.peak_allocated_bytes,
        row.measured.peak_allocated_bytes
    );
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("model");
    let config = TrainConfig {
        hf_out: Some(dir.clone()),
        ..c
    }
    .resolve()
    .unwrap();
    let mut t = Trainer::new(config, &corpus).unwrap();
    let report = t.train(&mut |_| {}).unwrap().clone();
    // Pretrained: validated at step 0 and at the end.
    let steps: Vec<u64> = report.val_losses.iter().map(|v| v.step).collect();
    assert_eq!(steps, [0, 2]);
    // The directory reads back as the file's model, with the tokenizer from its metadata.
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let written = headroom_nn::models::LlamaConfig::from_hf_json(&text).unwrap();
    let headroom_nn::models::ModelSpec::Llama(original) =
        headroom_nn::models::ModelSpec::resolve(&gguf_fixture()).unwrap()
    else {
        panic!("a GGUF file is a Llama");
    };
    assert_eq!(written, original);
    let tokenizer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).unwrap()).unwrap();
    // 3 control tokens, 256 byte symbols and 9 merges.
    assert_eq!(tokenizer["model"]["vocab"].as_object().unwrap().len(), 268);
    assert!(dir.join("model.safetensors").is_file());
}

#[test]
fn hf_out_naming_a_file_is_refused_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("taken");
    std::fs::write(&file, b"keep me").unwrap();
    let c = TrainConfig {
        hf_out: Some(file.clone()),
        ..run("llama", None, "fp32")
    }
    .resolve()
    .unwrap();
    let e = Trainer::new(c, &Corpus::bundled()).unwrap_err().to_string();
    assert!(e.contains("is a file") && e.contains("taken"), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
}
