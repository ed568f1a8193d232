//! The `plan`, `params` and `estimate` commands, run as the built binary: exit codes, JSON shape,
//! exports, and error messages for bad input.

use crate::common;

use common::{headroom, json, stderr};
use serde_json::Value;
use std::process::Output;

#[test]
fn plan_json_has_the_documented_shape_and_categories_sum_to_the_peak() {
    let o = headroom(&[
        "plan",
        "--model",
        "llama-2-7b",
        "--gpu",
        "A100-80GB",
        "--gpus-per-node",
        "8",
        "--seq-len",
        "4096",
        "--global-batch",
        "64",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    // Published count (docs/sources.md §7).
    assert_eq!(v["model"]["params"], 6_738_415_616u64);
    assert_eq!(v["hardware"]["world_size"], 8);
    let plans = v["plans"].as_array().unwrap();
    assert!(!plans.is_empty());
    for plan in plans {
        assert!(plan["strategy"]["precision"].is_string());
        assert!(plan["fits"].as_bool().unwrap());
        let peak = plan["memory"]["per_device_peak_bytes"].as_u64().unwrap();
        let cats = plan["memory"]["by_category"].as_object().unwrap();
        assert_eq!(cats.len(), 9);
        assert!(cats.contains_key("master_weight") && cats.contains_key("optimizer_state"));
        assert_eq!(
            cats.values().map(|b| b.as_u64().unwrap()).sum::<u64>(),
            peak
        );
        assert!(peak <= 81_920 * 1024 * 1024);
        assert!(plan["time"]["step_s"].as_f64().unwrap() > 0.0);
        assert!(plan["time"]["tokens_per_s"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(v["recommended"], plans[0]);
}

#[test]
fn when_offload_sets_the_step_time_a_tie_changes_no_lever_for_nothing() {
    // GPT-2 XL on a 24 GB card needs its states offloaded; at 128 tokens the PCIe transfers
    // set the step time, so recomputation and memory-efficient attention buy no speed. Among
    // plans within 5 % of the fastest the search keeps PyTorch's defaults for every lever it
    // need not change (as it does for headroom's own models).
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2-xl",
        "--gpu",
        "RTX-3090",
        "--seq-len",
        "128",
        "--framework",
        "fsdp",
        "--global-batch",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let best = &v["recommended"];
    let s = &best["strategy"];
    assert_eq!(s["checkpoint"], "none", "{s}");
    assert_eq!(s["attention"], "naive", "{s}");
    assert_eq!(s["loss"], "plain", "{s}");
    let step = |p: &Value| p["time"]["step_s"].as_f64().unwrap();
    let plans = v["plans"].as_array().unwrap();
    // A tie indeed: a plan that recomputes is listed and predicted no slower.
    assert!(
        plans
            .iter()
            .any(|p| p["strategy"]["checkpoint"] != "none" && step(p) <= step(best)),
        "{plans:?}"
    );
    let fastest = plans.iter().map(step).fold(f64::INFINITY, f64::min);
    assert!(step(best) <= fastest * 1.05);
}

#[test]
fn pinning_every_lever_evaluates_exactly_that_plan() {
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "L4",
        "--seq-len",
        "1024",
        "--global-batch",
        "8",
        "--micro-batch",
        "2",
        "--precision",
        "bf16-mixed",
        "--optimizer",
        "adamw",
        "--zero",
        "0",
        "--offload-optimizer",
        "none",
        "--offload-params",
        "none",
        "--offload-activations",
        "none",
        "--checkpoint",
        "every:2",
        "--attention",
        "naive",
        "--loss",
        "plain",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["search"]["evaluated"], 1);
    let s = &v["recommended"]["strategy"];
    assert_eq!(s["checkpoint"], "every:2");
    assert_eq!(s["micro_batch"], 2);
    assert_eq!(s["accumulation"], 4);
}

#[test]
fn the_step_in_backward_is_planned_on_one_gpu_and_refused_on_several() {
    let one = headroom(&[
        "plan",
        "--model",
        "llama-2-7b",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "1024",
        "--global-batch",
        "1",
        "--precision",
        "bf16",
        "--optimizer-in-backward",
        "--json",
    ]);
    assert!(one.status.success(), "{}", stderr(&one));
    let v = json(&one);
    assert_eq!(v["recommended"]["strategy"]["optimizer_in_backward"], true);
    assert_eq!(v["recommended"]["strategy"]["accumulation"], 1);
    let eight = headroom(&[
        "plan",
        "--model",
        "llama-2-7b",
        "--gpu",
        "A100-80GB",
        "--gpus-per-node",
        "8",
        "--seq-len",
        "1024",
        "--global-batch",
        "8",
        "--optimizer-in-backward",
    ]);
    assert!(!eight.status.success());
    let e = stderr(&eight);
    assert!(
        e.contains("--optimizer-in-backward") && e.contains("8 GPUs"),
        "{e}"
    );
}

#[test]
fn nothing_fits_reports_missing_bytes_and_exits_non_zero() {
    let o = headroom(&[
        "plan",
        "--model",
        "llama-2-70b",
        "--gpu",
        "L4",
        "--seq-len",
        "2048",
        "--global-batch",
        "1",
        "--offload-optimizer",
        "none",
        "--json",
    ]);
    assert!(!o.status.success());
    let v = json(&o);
    assert!(v["recommended"].is_null());
    assert!(v["shortfall"]["missing_bytes_per_device"].as_u64().unwrap() > 0);
    assert!(!v["plans"][0]["fits"].as_bool().unwrap());
    assert!(stderr(&o).contains("no plan fits"), "{}", stderr(&o));
}

#[test]
fn emits_write_parseable_configs_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("ds.json");
    let acc = dir.path().join("acc.yaml");
    let hr = dir.path().join("train.toml");
    let o = headroom(&[
        "plan",
        "--model",
        "mistral-7b",
        "--gpu",
        "A100-40GB",
        "--gpus-per-node",
        "4",
        "--seq-len",
        "2048",
        "--global-batch",
        "32",
        "--emit",
        "deepspeed",
        ds.to_str().unwrap(),
        "--emit",
        "accelerate",
        acc.to_str().unwrap(),
        "--emit",
        "headroom",
        hr.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(&ds).unwrap()).unwrap();
    assert_eq!(cfg["train_batch_size"], 32);
    let (mb, acc_steps) = (
        cfg["train_micro_batch_size_per_gpu"].as_u64().unwrap(),
        cfg["gradient_accumulation_steps"].as_u64().unwrap(),
    );
    assert_eq!(mb * acc_steps * 4, 32);
    assert!(cfg["zero_optimization"]["stage"].as_u64().unwrap() <= 3);
    let yaml = std::fs::read_to_string(&acc).unwrap();
    assert!(
        yaml.contains("num_processes: 4") && yaml.contains("distributed_type:"),
        "{yaml}"
    );
    let t: toml::Table = std::fs::read_to_string(&hr).unwrap().parse().unwrap();
    for key in [
        "precision",
        "micro_batch",
        "accumulation",
        "checkpoint",
        "attention",
        "optimizer",
        "zero_stage",
        "offload_optimizer",
        "offload_params",
        "offload_activations",
        "device_memory",
    ] {
        assert!(t.contains_key(key), "missing {key}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty());
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

#[test]
fn impossible_batch_is_rejected() {
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "A100-80GB",
        "--gpus-per-node",
        "4",
        "--seq-len",
        "512",
        "--global-batch",
        "6",
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("impossible batch") && e.contains("multiple of 4"),
        "{e}"
    );
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "4096",
        "--global-batch",
        "8",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("max_position_embeddings 1024"),
        "{}",
        stderr(&o)
    );
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "512",
        "--global-batch",
        "8",
        "--checkpoint",
        "sometimes",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("every:K"), "{}", stderr(&o));
}

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

#[test]
fn estimate_deepspeed_prints_deepspeeds_table() {
    let o = headroom(&[
        "estimate",
        "deepspeed",
        "--stage",
        "3",
        "--params",
        "2851e6",
        "--largest-layer",
        "32e6",
        "--gpus-per-node",
        "8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    // DeepSpeed docs (memory.rst), estimate_zero3_model_states_mem_needs_all_cold example.
    assert!(
        out.contains("SW: Model with 2851M total params, 32M largest layer params."),
        "{out}"
    );
    assert!(
        out.contains(
            "   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1"
        ),
        "{out}"
    );
    let o = headroom(&[
        "estimate",
        "deepspeed",
        "--stage",
        "3",
        "--params",
        "2851e6",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--largest-layer"), "{}", stderr(&o));
}

#[test]
fn estimate_accelerate_prints_accelerates_table() {
    let o = headroom(&["estimate", "accelerate", "--model", "bert-base-cased"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    // Accelerate docs: bert-base-cased total 413.18 MB at float32, training 1.61 GB.
    assert!(
        out.contains("413.18 MB") && out.contains("1.61 GB") && out.contains("N/A"),
        "{out}"
    );
}

#[test]
fn plan_counts_the_data_loaders_in_host_memory() {
    let base = [
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "512",
        "--global-batch",
        "8",
        "--micro-batch",
        "2",
        "--json",
    ];
    let host = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let o = headroom(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["recommended"]["memory"]["host_bytes_per_node"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(host(&[]), 0, "no offload, no loader given");
    // One GPU per node: 2 staging buffers (a queue of 1 and the one being copied) of
    // 2 × 8 B × 2 × 512 = 16 KiB, and 3 workers of a 256 KiB stack and 4 × 513 B of scratch.
    let per_rank = 2 * 16_384 + 3 * (262_144 + 4 * 513);
    assert_eq!(host(&["--workers", "3", "--prefetch", "1"]), per_rank);
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "512",
        "--global-batch",
        "8",
        "--prefetch",
        "1",
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("--workers"),
        "{}",
        stderr(&o)
    );
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

/// `plan --emit headroom` writes every lever of the recommended plan, the loss and the step in
/// backward included (the property test in the train crate reads such files back).
#[test]
fn the_headroom_export_carries_the_loss_and_the_step_in_backward() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train.toml");
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "1024",
        "--global-batch",
        "8",
        "--precision",
        "bf16-mixed",
        "--loss",
        "chunked:8",
        "--optimizer-in-backward",
        "--emit",
        "headroom",
        file.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t: toml::Table = std::fs::read_to_string(&file).unwrap().parse().unwrap();
    assert_eq!(
        t.get("loss").and_then(|v| v.as_str()),
        Some("chunked:8"),
        "{t}"
    );
    assert_eq!(
        t.get("optimizer_in_backward").and_then(|v| v.as_bool()),
        Some(true),
        "{t}"
    );
    assert_eq!(
        t.get("precision").and_then(|v| v.as_str()),
        Some("bf16-mixed"),
        "{t}"
    );
}

/// `plan` with `--emit` for mistral-7b on 4 × A100-40GB at ZeRO-3, the exports given.
fn plan_emitting(emits: &[&str]) -> Output {
    let mut args = vec![
        "plan",
        "--model",
        "mistral-7b",
        "--gpu",
        "A100-40GB",
        "--gpus-per-node",
        "4",
        "--seq-len",
        "2048",
        "--global-batch",
        "32",
        "--zero",
        "3",
    ];
    args.extend_from_slice(emits);
    headroom(&args)
}

#[test]
fn a_failing_emit_writes_none_of_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("train.toml");
    std::fs::write(&first, "# an earlier file\n").unwrap();
    let fresh = dir.path().join("acc.yaml");
    // The last file's directory is a regular file: nothing can be created under it.
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, "").unwrap();
    let unwritable = blocker.join("ds.json");
    let o = plan_emitting(&[
        "--emit",
        "headroom",
        first.to_str().unwrap(),
        "--emit",
        "accelerate",
        fresh.to_str().unwrap(),
        "--emit",
        "deepspeed",
        unwritable.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nothing was written"), "{}", stderr(&o));
    // The earlier file keeps its contents, no new file appears, no temporary is left behind.
    assert_eq!(
        std::fs::read_to_string(&first).unwrap(),
        "# an earlier file\n"
    );
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["blocker", "train.toml"]);
}

#[test]
fn the_accelerate_export_points_at_the_ds_config_emitted_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("ds.json");
    let acc = dir.path().join("acc.yaml");
    let o = plan_emitting(&[
        "--emit",
        "deepspeed",
        ds.to_str().unwrap(),
        "--emit",
        "accelerate",
        acc.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let yaml = std::fs::read_to_string(&acc).unwrap();
    // "deepspeed_config_file: path to the DeepSpeed config file in json format"
    // (https://huggingface.co/docs/accelerate/usage_guides/deepspeed); beside it Accelerate
    // refuses gradient_clipping, zero_stage, offload_*_device and mixed_precision.
    assert!(
        yaml.contains(&format!("  deepspeed_config_file: {}\n", ds.display())),
        "{yaml}"
    );
    for key in [
        "gradient_clipping",
        "zero_stage",
        "offload_optimizer_device",
        "mixed_precision",
    ] {
        assert!(!yaml.contains(key), "{key} beside the file:\n{yaml}");
    }
}
