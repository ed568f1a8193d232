//! `headroom plan` on headroom's own models and `headroom train --auto`, run as the built
//! binary: the planner's JSON shape, the budget respected, the exported config trains inside it,
//! the automatic choice recorded in the report, and clear errors for inputs that do not apply.

use crate::common::{headroom_in as headroom, stderr};
use serde_json::Value;

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
        "offload_activations",
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

    // The export carries the whole plan: where the states live and the allocator too.
    let t: toml::Table = std::fs::read_to_string(dir.path().join("best.toml"))
        .unwrap()
        .parse()
        .unwrap();
    for key in ["offload_optimizer", "offload_params", "offload_activations"] {
        assert_eq!(t[key].as_str(), s[key].as_str(), "{key}");
    }
    assert_eq!(
        t["zero_stage"].as_integer().map(|z| z as u64),
        s["zero_stage"].as_u64()
    );
    assert_eq!(t["allocator"].as_str(), v["allocator"].as_str());

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

/// `headroom plan --data-parallel N` plans one rank of N: every ZeRO stage is searched and
/// ranked, each stage holds a rank's share of the optimizer state (AdamW's 8 bytes per
/// parameter, sharded from stage 1 on), and `--zero` pins one.
#[test]
fn plan_ranks_the_zero_stages_for_data_parallel_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "plan",
        "--model",
        "gpt-small",
        "--device-memory",
        "64MiB",
        "--data-parallel",
        "4",
        "--precision",
        "fp32",
        "--optimizer",
        "adamw",
        // Every plan listed: the order follows this machine's measured kernel rates, so a
        // shorter list need not reach every stage.
        "--top",
        "1000",
        "--json",
    ];
    let o = headroom(&args, dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o.stdout);
    assert_eq!(v["hardware"]["world_size"], 4);
    assert_eq!(
        v["workload"]["global_batch"].as_u64().unwrap(),
        4 * v["workload"]["batch_per_rank"].as_u64().unwrap()
    );
    let plans = v["plans"].as_array().unwrap();
    let stage = |p: &Value| p["strategy"]["zero_stage"].as_u64().unwrap();
    let mut stages: Vec<u64> = plans.iter().map(stage).collect();
    stages.sort_unstable();
    stages.dedup();
    assert_eq!(stages, vec![0, 1, 2, 3]);
    // gpt-small's 842,496 parameters: AdamW's two fp32 moments, 6,739,968 bytes whole, about a
    // quarter of it per rank when sharded (each block's shard rounded up to 512 bytes), none
    // on the device when offloaded to the host.
    let psi = 842_496u64;
    for p in plans {
        let optim = p["memory"]["by_category"]["optimizer_state"]
            .as_u64()
            .unwrap();
        if p["strategy"]["offload_optimizer"] == "cpu" {
            assert!(stage(p) >= 1, "{p}");
            assert_eq!(optim, 0, "{p}");
        } else if stage(p) == 0 {
            assert_eq!(optim, 8 * psi, "{p}");
        } else {
            assert!(optim >= 2 * psi && optim < 2 * psi + 16 * 1024, "{p}");
        }
    }
    let mut pinned = args.to_vec();
    pinned.extend(["--zero", "3"]);
    let o = headroom(&pinned, dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o.stdout);
    assert!(v["plans"].as_array().unwrap().iter().all(|p| stage(p) == 3));
}

#[test]
fn inputs_that_do_not_apply_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 6] = [
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
            "add --data-parallel N",
        ),
        (
            &[
                "plan",
                "--model",
                "gpt-tiny",
                "--device-memory",
                "8MiB",
                "--data-parallel",
                "3",
                "--global-batch",
                "16",
            ],
            "does not split over --data-parallel 3",
        ),
        (
            &[
                "plan",
                "--model",
                "gpt2",
                "--gpu",
                "A100-80GB",
                "--seq-len",
                "128",
                "--data-parallel",
                "2",
            ],
            "--gpus-per-node",
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
