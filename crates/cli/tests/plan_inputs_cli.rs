//! `headroom plan` inputs end to end: a hardware file naming its own GPU, a lone bf16 peak, a
//! sequence beyond the model's trained context (warned), the no-fit message under --json, the
//! export flags (rank 0's address, the NVMe path), and a measured step to calibrate against.

use crate::common;

use common::{headroom, json, stderr};
use serde_json::Value;
use std::process::Output;

#[test]
fn a_hardware_file_may_name_its_own_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let hw = dir.path().join("hw.toml");
    // RTX 3080, not a preset: 10 GiB, 760 GB/s, fp16/bf16 tensor 59.5 TFLOPS, fp32 29.8 (GA102
    // whitepaper).
    std::fs::write(
        &hw,
        "gpu = \"RTX-3080\"\ngpu_memory = \"10GiB\"\nbf16_tflops = 59.5\nfp16_tflops = 59.5\nfp32_tflops = 29.8\nmemory_bandwidth_gbps = 760\n",
    )
    .unwrap();
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--hardware",
        hw.to_str().unwrap(),
        "--seq-len",
        "1024",
        "--global-batch",
        "8",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["hardware"]["gpu"]["name"], "RTX-3080");
    assert_eq!(v["hardware"]["gpu"]["memory_bytes"], 10u64 << 30);
}

#[test]
fn a_lone_bf16_peak_scales_the_fp32_peak_too() {
    // RTX-4090 preset: bf16 165.2, fp32 82.6 TFLOPS; --bf16-tflops 82.6 halves the GPU's
    // speed, so fp32 becomes 41.3 and stays half the bf16 peak: fp32 is not the fastest.
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "RTX-4090",
        "--bf16-tflops",
        "82.6",
        "--seq-len",
        "1024",
        "--global-batch",
        "8",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let fp32 = v["hardware"]["gpu"]["fp32_tflops"].as_f64().unwrap();
    assert!((fp32 - 41.3).abs() < 1e-9, "{fp32}");
    assert_ne!(
        v["recommended"]["strategy"]["precision"], "fp32",
        "{}",
        v["recommended"]
    );
}

#[test]
fn a_sequence_beyond_the_trained_context_is_warned() {
    let args = |seq: &'static str| {
        [
            "plan",
            "--model",
            "llama-2-7b",
            "--gpu",
            "H100-80GB",
            "--gpus-per-node",
            "8",
            "--seq-len",
            seq,
            "--global-batch",
            "8",
            "--json",
        ]
    };
    let o = headroom(&args("32768"));
    // llama-2-7b's config.json: max_position_embeddings 4096.
    let want = "--seq-len 32768 exceeds max_position_embeddings 4096";
    assert!(
        stderr(&o).contains(&format!("warning: {want}")),
        "{}",
        stderr(&o)
    );
    let w = json(&o)["warnings"].as_array().unwrap().clone();
    assert_eq!(w.len(), 1);
    assert!(w[0].as_str().unwrap().contains(want), "{w:?}");
    let o = headroom(&args("4096"));
    assert_eq!(json(&o)["warnings"], serde_json::json!([]));
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
}

#[test]
fn the_json_no_fit_message_points_into_the_json() {
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
    let e = stderr(&o);
    assert!(e.contains("no plan fits") && !e.contains("above"), "{e}");
    assert!(e.contains("shortfall.suggestions"), "{e}");
}

#[test]
fn multi_node_accelerate_exports_take_rank_0_and_the_nvme_path_from_flags() {
    let dir = tempfile::tempdir().unwrap();
    let acc = dir.path().join("acc.yaml");
    let base = [
        "plan",
        "--model",
        "llama-2-7b",
        "--gpu",
        "A100-80GB",
        "--gpus-per-node",
        "8",
        "--nodes",
        "2",
        "--seq-len",
        "2048",
        "--global-batch",
        "16",
        "--zero",
        "3",
        "--offload-optimizer",
        "nvme",
        "--offload-params",
        "nvme",
        "--precision",
        "bf16-mixed",
        // NVMe offload is DeepSpeed's: Accelerate then writes its DeepSpeed plugin.
        "--framework",
        "deepspeed",
        "--emit",
        "accelerate",
    ];
    let mut args = base.to_vec();
    args.push(acc.to_str().unwrap());
    let o = headroom(&args);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--main-process-ip"), "{}", stderr(&o));
    args.extend(["--main-process-ip", "10.1.2.3", "--nvme-path", "/mnt/nvme0"]);
    let o = headroom(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let yaml = std::fs::read_to_string(&acc).unwrap();
    for line in [
        "main_process_ip: 10.1.2.3",
        "main_process_port: 29500",
        "num_machines: 2",
        "machine_rank: 0",
        "  offload_optimizer_nvme_path: /mnt/nvme0",
        "  offload_param_nvme_path: /mnt/nvme0",
    ] {
        assert!(yaml.lines().any(|l| l == line), "{line} not in\n{yaml}");
    }
}

#[test]
fn calibrate_rescales_to_a_measured_step_and_names_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    // Hugging Face's single-GPU guide: bert-large-uncased, 512 tokens, fp32, V100, micro-batch 4
    // at 8.86 samples/s = 4,536 tokens/s.
    let file = dir.path().join("measured.json");
    std::fs::write(
        &file,
        r#"{"strategy": {"precision": "fp32", "optimizer": "adamw", "zero_stage": 0,
            "offload_optimizer": "none", "offload_params": "none", "checkpoint": "none",
            "attention": "naive", "micro_batch": 4, "accumulation": 1},
            "tokens_per_s": 4536.3, "source": "HF single-GPU guide"}"#,
    )
    .unwrap();
    // The measured strategy itself, pinned.
    let plan = |calibrate: &str, extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            "bert-large-uncased",
            "--gpu",
            "V100-16GB",
            "--seq-len",
            "512",
            "--global-batch",
            "4",
            "--precision",
            "fp32",
            "--micro-batch",
            "4",
            "--accumulation",
            "1",
            "--attention",
            "naive",
            "--checkpoint",
            "none",
            "--optimizer",
            "adamw",
            "--calibrate",
            calibrate,
        ];
        args.extend_from_slice(extra);
        headroom(&args)
    };
    let path = file.to_str().unwrap();
    let text = plan(path, &[]);
    assert!(text.status.success(), "{}", stderr(&text));
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(
        out.contains("Calibrated to 4536 measured tokens/s from HF single-GPU guide"),
        "{out}"
    );
    // The measured strategy is then predicted at the measured speed.
    assert!(out.contains("4,536 tokens/s"), "{out}");
    let v = json(&plan(path, &["--json"]));
    let c = &v["calibration"];
    // The V100's fp32 efficiency is fitted to this very run, so the scale stays near 1.
    let (before, after) = (
        c["efficiency_before"].as_f64().unwrap(),
        c["efficiency_after"].as_f64().unwrap(),
    );
    let scale = v["cost_model"]["efficiency_scale"].as_f64().unwrap();
    assert!(
        (after / before - scale).abs() < 1e-9,
        "{before} {after} {scale}"
    );
    assert!((scale - 1.0).abs() < 0.01, "{scale}");

    let missing = plan("no-such.json", &[]);
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("--calibrate no-such.json"),
        "{}",
        stderr(&missing)
    );
    std::fs::write(&file, r#"{"tokens_per_s": 1}"#).unwrap();
    let bad = plan(path, &[]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("calibration file: missing field `strategy`"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn the_framework_follows_the_exports_unless_given() {
    let dir = tempfile::tempdir().unwrap();
    let out = |emits: &[&str], extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            "llama-2-7b",
            "--gpu",
            "A100-80GB",
            "--gpus-per-node",
            "8",
            "--seq-len",
            "2048",
            "--global-batch",
            "8",
            "--json",
        ];
        args.extend_from_slice(emits);
        args.extend_from_slice(extra);
        headroom(&args)
    };
    let acc = dir.path().join("acc.yaml");
    let ds = dir.path().join("ds.json");
    let (acc, ds) = (acc.to_str().unwrap(), ds.to_str().unwrap());
    let framework = |o: &Output| json(o)["framework"].as_str().unwrap().to_string();
    assert_eq!(framework(&out(&[], &[])), "deepspeed");
    assert_eq!(framework(&out(&["--emit", "accelerate", acc], &[])), "fsdp");
    assert_eq!(
        framework(&out(
            &["--emit", "accelerate", acc, "--emit", "deepspeed", ds],
            &[]
        )),
        "deepspeed"
    );
    // Asked for explicitly against its export: refused with the fix, exit status 1.
    let o = out(&["--emit", "deepspeed", ds], &["--framework", "fsdp"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--framework deepspeed"),
        "{}",
        stderr(&o)
    );
    // A bad value names the flag and the accepted ones.
    let o = out(&[], &["--framework", "megatron"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--framework") && stderr(&o).contains("deepspeed, fsdp"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn selective_op_checkpointing_is_planned_but_not_trained() {
    let o = headroom(&[
        "plan",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "H100-80GB",
        "--gpus-per-node",
        "8",
        "--seq-len",
        "8192",
        "--global-batch",
        "16",
        "--micro-batch",
        "2",
        "--checkpoint",
        "selective-op",
        "--attention",
        "memory-efficient",
        "--zero",
        "3",
        "--framework",
        "fsdp",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["recommended"]["strategy"]["checkpoint"], "selective-op");
    let o = headroom(&["train", "--checkpoint", "selective-op", "--steps", "1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("does not run"), "{}", stderr(&o));
}

#[test]
fn the_lora_base_dtype_flag_counts_the_frozen_base_as_loaded() {
    // Llama-2-7B (6,738,415,616 parameters) with LoRA on q and v under FSDP bf16-mixed: loaded
    // in fp32, as PEFT's FSDP example does, the frozen base holds 2 more bytes per parameter
    // than the default bf16.
    let steady_parameters = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            "llama-2-7b",
            "--gpu",
            "A100-80GB",
            "--seq-len",
            "512",
            "--framework",
            "fsdp",
            "--precision",
            "bf16-mixed",
            "--optimizer",
            "adamw",
            "--zero",
            "0",
            "--micro-batch",
            "1",
            "--accumulation",
            "1",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q,v",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = headroom(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["recommended"]["memory"]["steady_by_category"]["parameter"]
            .as_u64()
            .unwrap()
    };
    let default = steady_parameters(&[]);
    let fp32 = steady_parameters(&["--lora-base-dtype", "fp32"]);
    assert_eq!(fp32 - default, 2 * 6_738_415_616);
    // Without --lora-rank the flag is refused by name.
    let o = headroom(&["plan", "--model", "gpt2", "--lora-base-dtype", "fp32"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--lora-rank"), "{}", stderr(&o));
}

#[test]
fn the_lora_dropout_flag_keeps_each_adapted_inputs_dropped_copy() {
    // Llama-2-7B with LoRA on q and v under DeepSpeed bf16-mixed (16-bit activations), 512
    // tokens, no checkpointing. Without dropout a block keeps the attention's input once for
    // both adapters (4,096 features, 2 bytes); with PEFT's per-module dropout q and v each keep
    // a dropped copy (2 bytes) and its 1-byte mask instead: 512·(2·4,096·3 − 4,096·2) =
    // 8,388,608 bytes a block, 268,435,456 over 32 blocks.
    let activations = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            "llama-2-7b",
            "--gpu",
            "A100-80GB",
            "--seq-len",
            "512",
            "--framework",
            "deepspeed",
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
            "none",
            "--attention",
            "memory-efficient",
            "--loss",
            "plain",
            "--micro-batch",
            "1",
            "--accumulation",
            "1",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q,v",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = headroom(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["recommended"]["memory"]["by_category"]["activation"]
            .as_u64()
            .unwrap()
    };
    let none = activations(&[]);
    let dropped = activations(&["--lora-dropout", "0.05"]);
    assert_eq!(dropped - none, 268_435_456);
    // A probability is needed, and a LoRA run.
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "512",
        "--lora-rank",
        "8",
        "--lora-dropout",
        "1.5",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("0 <= p < 1"), "{}", stderr(&o));
    let o = headroom(&["plan", "--model", "gpt2", "--lora-dropout", "0.1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--lora-rank"), "{}", stderr(&o));
}

#[test]
fn a_gpu_name_may_be_written_in_any_case_and_with_spaces() {
    let plan = |gpu: &str, extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            "gpt2",
            "--gpu",
            gpu,
            "--seq-len",
            "1024",
            "--global-batch",
            "8",
            "--json",
        ];
        args.extend_from_slice(extra);
        headroom(&args)
    };
    for typed in ["RTX 4090", "rtx4090", "rtx-4090"] {
        let o = plan(typed, &[]);
        assert!(o.status.success(), "{typed}: {}", stderr(&o));
        assert_eq!(json(&o)["hardware"]["gpu"]["name"], "RTX-4090", "{typed}");
    }
    // Three presets start with H100: the error names them and no other.
    let o = plan("h100", &[]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("matches several presets: H100-80GB, H100-NVL, H100-PCIe"),
        "{e}"
    );
    // A name matching none gets the nearest presets.
    let o = plan("4090", &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nearest: RTX-4090"), "{}", stderr(&o));
}

#[test]
fn a_gpu_memory_without_its_unit_is_refused_not_read_as_bytes() {
    let plan = |memory: &str| {
        headroom(&[
            "plan",
            "--model",
            "gpt2",
            "--gpu",
            "A100-80GB",
            "--gpu-memory",
            memory,
            "--seq-len",
            "1024",
            "--global-batch",
            "8",
            "--json",
        ])
    };
    let o = plan("80");
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("gpu_memory") && e.contains("is 80 bytes") && e.contains("80GB or 80GiB"),
        "{e}"
    );
    let o = plan("80GB");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        json(&o)["hardware"]["gpu"]["memory_bytes"],
        80_000_000_000u64
    );
}

#[test]
fn compile_is_an_input_the_report_and_the_step_time_carry() {
    // nanoGPT's GPT-2 run (8 A100 40GB, micro-batch 12 × 5): a compiled step moves fewer bytes,
    // so it is faster, and the JSON says which was planned; a value other than true or false is
    // refused by name.
    let run = |compile: &str| {
        let o = headroom(&[
            "plan",
            "--model",
            "gpt2",
            "--gpu",
            "A100-40GB",
            "--gpus-per-node",
            "8",
            "--seq-len",
            "1024",
            "--framework",
            "fsdp",
            "--precision",
            "bf16-mixed",
            "--optimizer",
            "adamw",
            "--zero",
            "0",
            "--checkpoint",
            "none",
            "--attention",
            "memory-efficient",
            "--micro-batch",
            "12",
            "--accumulation",
            "5",
            "--compile",
            compile,
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)
    };
    let (eager, compiled) = (run("false"), run("true"));
    assert_eq!(eager["compile"], false);
    assert_eq!(compiled["compile"], true);
    let tokens = |v: &Value| v["recommended"]["time"]["tokens_per_s"].as_f64().unwrap();
    assert!(tokens(&compiled) > tokens(&eager));
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "A100-40GB",
        "--compile",
        "yes",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--compile"), "{}", stderr(&o));
}
