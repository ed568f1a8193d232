//! `--resume DIR` alone continues a saved run as it was started: the saved strategy (here one
//! that differs from every default), bit for bit against an uninterrupted run; flags may change
//! only what keeps the run's numbers, each change reported; saves keep going to the resumed
//! directory; the validation history before the resume point is kept.

use crate::common::headroom_in as headroom;
use std::path::Path;
use std::process::Output;

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// A strategy no default matches: bf16-mixed, SGD with momentum, 2 × 2, every block
/// checkpointed.
const STRATEGY: [&str; 12] = [
    "--precision",
    "bf16-mixed",
    "--optimizer",
    "sgd-momentum",
    "--micro-batch",
    "2",
    "--accumulation",
    "2",
    "--checkpoint",
    "all",
    "--eval-every",
    "1",
];

fn train(extra: &[&str], dir: &Path) -> Output {
    let mut args = vec![
        "train",
        "--model",
        "gpt-tiny",
        "--eval-batches",
        "1",
        "--no-timeline",
    ];
    args.extend_from_slice(extra);
    headroom(&args, dir)
}

fn report(dir: &Path, name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
}

#[test]
fn resume_alone_continues_the_saved_strategy_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut straight = STRATEGY.to_vec();
    straight.extend(["--steps", "4", "--json-report", "straight.json"]);
    ok(&train(&straight, d));
    let mut first = STRATEGY.to_vec();
    first.extend(["--steps", "2", "--save-dir", "runs"]);
    ok(&train(&first, d));
    // No strategy flag: the saved one (bf16-mixed, SGD-momentum, 2 × 2, all) continues.
    let stderr = ok(&train(
        &[
            "--resume",
            "runs",
            "--steps",
            "4",
            "--json-report",
            "resumed.json",
        ],
        d,
    ));
    assert!(stderr.contains("bf16-mixed, sgd-momentum"), "{stderr}");
    let (a, b) = (report(d, "straight.json"), report(d, "resumed.json"));
    assert_eq!(a["losses"], b["losses"], "losses differ after resume");
    assert_eq!(b["config"]["precision"], "bf16-mixed");
    // Validation history of the first run is kept: steps 1 to 4.
    assert_eq!(a["val_losses"], b["val_losses"]);
    // Saves went on into the resumed directory.
    assert!(d.join("runs/step-000004/manifest.json").is_file());
}

#[test]
fn resume_refuses_changes_to_the_numbers_and_reports_sound_ones() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut first = STRATEGY.to_vec();
    first.extend(["--steps", "1", "--save-dir", "runs"]);
    ok(&train(&first, d));
    let out = train(&["--resume", "runs", "--precision", "fp32"], d);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("precision") && stderr.contains("cannot change"),
        "{stderr}"
    );
    let out = train(&["--resume", "runs", "--micro-batch", "3"], d);
    assert!(
        !out.status.success(),
        "3 does not divide the effective batch of 4"
    );
    // The same effective batch of 4 as 1 × 4: allowed, and said.
    let stderr = ok(&train(
        &["--resume", "runs", "--steps", "2", "--micro-batch", "1"],
        d,
    ));
    assert!(stderr.contains("changed micro_batch: 2 → 1"), "{stderr}");
    assert!(stderr.contains("changed accumulation: 2 → 4"), "{stderr}");
}
