//! `headroom plan --emit`, run as the built binary: the DeepSpeed, Accelerate and headroom
//! exports (parseable, every lever carried, all written or none), the flags a multi-node export
//! takes (rank 0's address, the NVMe path), and the framework the exports imply.

use crate::common;

use common::{headroom, json, stderr};
use serde_json::Value;
use std::process::Output;

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
