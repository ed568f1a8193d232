//! `--model` as `params` and `plan` read it, run as the built binary: published parameter
//! counts, headroom's own presets and model TOMLs, and the errors for a malformed config.json
//! or an unknown model or GPU preset.

use crate::common;

use common::{headroom, json, stderr};
use serde_json::Value;
use std::process::Output;

#[test]
fn params_json_reports_total_and_largest_layer() {
    let o = headroom(&["params", "--model", "t5-large", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    // DeepSpeed memory docs: t5-large 737.67M total, largest layer 32.90M (the shared embedding).
    assert_eq!(v["total"], 737_668_096u64);
    assert_eq!(v["largest_layer"]["params"], 32_899_072u64);
    let sum: u64 = v["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["params_total"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, 737_668_096);
}

/// `params`, `plan` and `train` read `--model` in one namespace: headroom's own presets and
/// model TOMLs count in `params` as they plan in `plan`, and an unknown name gets one message.
#[test]
fn params_reads_headrooms_own_models_as_plan_does() {
    let o = headroom(&["params", "--model", "gpt-small", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    // gpt-small: vocabulary 256, context 128, 4 blocks of width 128 (MLP 512), tied head.
    // Embeddings 256·128 + 128·128; per block two norms 4·128, qkv 128·384 + 384, output
    // 128·128 + 128, MLP 128·512 + 512 + 512·128 + 128; final norm 2·128.
    let block = 4 * 128 + 128 * 384 + 384 + 128 * 128 + 128 + 128 * 512 + 512 + 512 * 128 + 128;
    assert_eq!(v["total"], 256 * 128 + 128 * 128 + 4 * block + 2 * 128);
    assert_eq!(v["model_type"], "headroom-gpt");

    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("deep.toml");
    std::fs::write(
        &model,
        "kind = \"resmlp\"\nvocab = 256\nwidth = 64\nhidden = 256\ndepth = 3\ndropout = 0.0\n",
    )
    .unwrap();
    let o = headroom(&["params", "--model", model.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    // Embedding 256·64; per block a norm 2·64, 64·256 + 256 and 256·64 + 64; final norm 2·64;
    // head 64·256.
    let block = 2 * 64 + 64 * 256 + 256 + 256 * 64 + 64;
    assert_eq!(v["total"], 256 * 64 + 3 * block + 2 * 64 + 64 * 256);
    assert_eq!(v["model_type"], "headroom-resmlp");

    let params = headroom(&["params", "--model", "gpt-smal"]);
    let plan = headroom(&[
        "plan",
        "--model",
        "gpt-smal",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "128",
        "--global-batch",
        "8",
    ]);
    assert!(!params.status.success() && !plan.status.success());
    let message = |o: &Output| {
        stderr(o)
            .lines()
            .find(|l| l.contains("unknown model"))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{}", stderr(o)))
    };
    assert_eq!(message(&params), message(&plan));
    assert!(
        message(&params).contains("gpt-small") && message(&params).contains("llama-2-7b"),
        "{}",
        message(&params)
    );
}

#[test]
fn malformed_config_json_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config.json");
    std::fs::write(&bad, "{\"model_type\": \"llama\", \"hidden_size\": ").unwrap();
    let o = headroom(&["params", "--model", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not valid JSON"), "{}", stderr(&o));

    std::fs::write(&bad, r#"{"model_type": "falcon", "hidden_size": 64}"#).unwrap();
    let o = headroom(&["params", "--model", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("model_type 'falcon'")
            && e.contains(
                "llama, mistral, mixtral, qwen2, qwen2_moe, gemma, gemma2, phi3, gpt2, gpt_neox, bert, t5"
            ),
        "{e}"
    );

    std::fs::write(&bad, r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 2, "vocab_size": 10}"#).unwrap();
    let o = headroom(&["params", "--model", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("'intermediate_size' is missing"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn unknown_presets_name_the_accepted_values() {
    let o = headroom(&["params", "--model", "llama-9-1t"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown model 'llama-9-1t'")
            && stderr(&o).contains("mixtral-8x7b")
            && stderr(&o).contains("gpt-small"),
        "{}",
        stderr(&o)
    );
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "TPU-v5",
        "--seq-len",
        "128",
        "--global-batch",
        "1",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown GPU preset 'TPU-v5'") && stderr(&o).contains("H100-80GB"),
        "{}",
        stderr(&o)
    );
}
