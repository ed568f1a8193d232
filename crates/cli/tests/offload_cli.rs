//! Offload through the binary: `headroom train --offload-optimizer` reports its tiers, bad
//! placements and directories are refused with the fix, and `headroom bench offload` writes
//! rates that `headroom plan --hardware` uses.

use crate::common::{headroom, output_text as text};
use serde_json::Value;

#[test]
fn train_with_states_on_disk_reports_every_tier() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let offload = dir.path().join("offload");
    let o = headroom(&[
        "train",
        "--model",
        "gpt-tiny",
        "--steps",
        "3",
        "--eval-every",
        "0",
        "--zero",
        "1",
        "--offload-optimizer",
        "nvme",
        "--offload-dir",
        offload.to_str().unwrap(),
        "--json-report",
        report.to_str().unwrap(),
        "--timeline",
        dir.path().join("t.svg").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("Offload tiers"), "{}", text(&o));
    let v: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let off = &v["offload"];
    assert!(
        off["disk"]["optimizer_state"].as_u64().unwrap() > 0,
        "{off}"
    );
    assert_eq!(off["host"]["optimizer_state"], 0);
    assert_eq!(v["peak_bytes_by_category"]["optimizer_state"], 0);
    // The scratch file is gone with the run.
    assert_eq!(std::fs::read_dir(&offload).unwrap().count(), 0);
}

#[test]
fn offload_without_zero_or_with_a_file_for_a_directory_is_refused_with_the_fix() {
    let o = headroom(&["train", "--steps", "1", "--offload-optimizer", "cpu"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--zero 1, 2 or 3"), "{}", text(&o));
    let o = headroom(&[
        "train",
        "--steps",
        "1",
        "--zero",
        "1",
        "--offload-params",
        "cpu",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--zero 3"), "{}", text(&o));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let o = headroom(&[
        "train",
        "--model",
        "gpt-tiny",
        "--steps",
        "1",
        "--zero",
        "1",
        "--offload-optimizer",
        "nvme",
        "--offload-dir",
        file.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--offload-dir"), "{}", text(&o));
}

/// The recommended plan's offload seconds for gpt2 on one A100 with FSDP's CPU offload, under
/// the hardware file `hw`. Under FSDP the host update adds to the copies; under DeepSpeed it
/// overlaps the parameters' upload, so its share would depend on the measured copy rate.
fn offload_seconds(hw: &std::path::Path) -> (f64, f64) {
    let o = headroom(&[
        "plan",
        "--framework",
        "fsdp",
        "--model",
        "gpt2",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "1024",
        "--global-batch",
        "8",
        "--micro-batch",
        "8",
        "--zero",
        "3",
        "--offload-optimizer",
        "cpu",
        "--offload-params",
        "cpu",
        "--hardware",
        hw.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    (
        v["recommended"]["time"]["offload_s"].as_f64().unwrap(),
        v["model"]["params"].as_f64().unwrap(),
    )
}

#[test]
fn bench_offload_writes_the_rates_plan_uses() {
    let dir = tempfile::tempdir().unwrap();
    let hw = dir.path().join("hw.toml");
    let o = headroom(&[
        "bench",
        "offload",
        "--params-millions",
        "1",
        "--disk-mib",
        "16",
        "--steps",
        "0",
        "--offload-dir",
        dir.path().to_str().unwrap(),
        "--write-hardware",
        hw.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rate = v["update"]["host_offload_step"].as_f64().unwrap();
    assert!(rate > 0.0);
    let written: toml::Table = std::fs::read_to_string(&hw).unwrap().parse().unwrap();
    let cpu = written["cpu_optimizer_params_per_s"].as_float().unwrap();
    assert!((cpu / rate - 1.0).abs() < 1e-3, "{cpu} against {rate}");
    let pcie = written["pcie_bandwidth_gbps"].as_float().unwrap();
    let copies = [
        v["copy"]["device_to_host_gb_per_s"].as_f64().unwrap(),
        v["copy"]["host_to_device_gb_per_s"].as_f64().unwrap(),
    ];
    assert!((pcie - copies[0].min(copies[1])).abs() < 1e-3);
    // The planner uses the file: with the host optimizer twice as fast, one GPU's offload
    // time drops by exactly half of (parameters / rate), the host update's share.
    let (measured, params) = offload_seconds(&hw);
    let faster = dir.path().join("faster.toml");
    let doubled = format!(
        "cpu_optimizer_params_per_s = {:e}\npcie_bandwidth_gbps = {pcie}\n",
        2.0 * cpu
    );
    std::fs::write(&faster, doubled).unwrap();
    let (quicker, _) = offload_seconds(&faster);
    let expected = params / cpu / 2.0;
    assert!(
        ((measured - quicker) / expected - 1.0).abs() < 1e-6,
        "{measured} − {quicker} against {expected}"
    );
}
