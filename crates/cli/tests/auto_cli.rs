//! `headroom plan` on headroom's own models and `headroom train --auto`, run as the built
//! binary: the planner's JSON shape, the budget respected, the exported config trains inside it,
//! the automatic choice recorded in the report, and clear errors for inputs that do not apply.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn headroom(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run headroom")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(bytes)))
}

const BUDGET: u64 = 3 << 20;

#[test]
fn plan_for_an_own_model_has_the_planners_shape_and_fits_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let o = headroom(
        &[
            "plan",
            "--model",
            "gpt-tiny",
            "--device-memory",
            "3MiB",
            "--global-batch",
            "8",
            "--seq-len",
            "32",
            "--json",
            "--emit",
            "headroom",
            "best.toml",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o.stdout);
    for key in [
        "model",
        "hardware",
        "workload",
        "cost_model",
        "search",
        "plans",
        "recommended",
        "advice",
        "shortfall",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["model"]["model_type"], "headroom-gpt");
    assert_eq!(v["workload"]["tokens_per_step"], 8 * 32);
    let best = &v["recommended"];
    assert_eq!(best["fits"], true);
    let s = &best["strategy"];
    for key in [
        "precision",
        "optimizer",
        "zero_stage",
        "offload_optimizer",
        "offload_params",
        "checkpoint",
        "attention",
        "micro_batch",
        "accumulation",
    ] {
        assert!(s.get(key).is_some(), "strategy lacks {key}");
    }
    assert_eq!(
        s["micro_batch"].as_u64().unwrap() * s["accumulation"].as_u64().unwrap(),
        8
    );
    let peak = best["memory"]["per_device_peak_bytes"].as_u64().unwrap();
    assert!(peak <= BUDGET, "{peak}");
    let sum: u64 = best["memory"]["by_category"]
        .as_object()
        .unwrap()
        .values()
        .map(|b| b.as_u64().unwrap())
        .sum();
    assert_eq!(sum, peak, "categories sum to the peak");
    assert!(best["time"]["tokens_per_s"].as_f64().unwrap() > 0.0);

    // The exported config trains inside the same budget, with no out-of-memory recovery.
    let o = headroom(
        &[
            "train",
            "--config",
            "best.toml",
            "--steps",
            "2",
            "--eval-batches",
            "1",
            "--no-timeline",
            "--json-report",
            "report.json",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("out of memory"), "{}", stderr(&o));
    let report = json(&std::fs::read(dir.path().join("report.json")).unwrap());
    assert!(report["peak_reserved_bytes"].as_u64().unwrap() <= BUDGET);
    assert_eq!(report["config"]["precision"], s["precision"]);
    assert_eq!(report["config"]["micro_batch"], s["micro_batch"]);
    assert!(report["auto"].is_null(), "every lever was set by the file");
}

#[test]
fn train_chooses_a_strategy_when_no_lever_is_given_and_keeps_pinned_ones() {
    let dir = tempfile::tempdir().unwrap();
    let common = [
        "train",
        "--model",
        "gpt-tiny",
        "--seq-len",
        "32",
        "--steps",
        "2",
        "--eval-batches",
        "1",
        "--device-memory",
        "3MiB",
        "--no-timeline",
        "--json-report",
    ];
    let args: Vec<&str> = common.iter().copied().chain(["auto.json"]).collect();
    let o = headroom(&args, dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).starts_with("auto: "), "{}", stderr(&o));
    let r = json(&std::fs::read(dir.path().join("auto.json")).unwrap());
    assert!(r["auto"]["reason"].as_str().unwrap().contains("fit"));
    let c = &r["config"];
    // The embedded default effective batch (16 × 1) is kept.
    assert_eq!(
        c["micro_batch"].as_u64().unwrap() * c["accumulation"].as_u64().unwrap(),
        16
    );
    assert!(r["peak_reserved_bytes"].as_u64().unwrap() <= BUDGET);

    // --auto with a pinned precision keeps it.
    let args: Vec<&str> = common
        .iter()
        .copied()
        .chain(["pinned.json", "--auto", "--precision", "bf16-mixed"])
        .collect();
    let o = headroom(&args, dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let r = json(&std::fs::read(dir.path().join("pinned.json")).unwrap());
    assert_eq!(r["config"]["precision"], "bf16-mixed");
    assert!(!r["auto"].is_null());

    // A lever given without --auto runs as configured.
    let args: Vec<&str> = common
        .iter()
        .copied()
        .chain(["manual.json", "--micro-batch", "2", "--accumulation", "8"])
        .collect();
    let o = headroom(&args, dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let r = json(&std::fs::read(dir.path().join("manual.json")).unwrap());
    assert!(r["auto"].is_null());
    assert_eq!(r["config"]["precision"], "fp32");
}

#[test]
fn inputs_that_do_not_apply_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["plan", "--model", "gpt-tiny"], "--device-memory"),
        (
            &[
                "plan",
                "--model",
                "gpt-tiny",
                "--device-memory",
                "8MiB",
                "--zero",
                "2",
            ],
            "ZeRO stage 0",
        ),
        (
            &[
                "plan",
                "--model",
                "gpt-tiny",
                "--device-memory",
                "8MiB",
                "--optimizer",
                "adafactor",
            ],
            "does not run it",
        ),
        (
            &[
                "plan",
                "--model",
                "llama-2-7b",
                "--device-memory",
                "8GiB",
                "--seq-len",
                "128",
                "--global-batch",
                "8",
            ],
            "--gpu",
        ),
        (
            &["plan", "--model", "resmlp", "--device-memory", "2MiB"],
            "--device-memory",
        ),
    ];
    for (args, needle) in cases {
        let o = headroom(args, dir.path());
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}
