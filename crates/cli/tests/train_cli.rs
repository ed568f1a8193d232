//! `headroom train` end to end on the tiny GPT: the JSON report's members and their
//! relations, the timeline picture, resume, and clear non-zero exits for a malformed config and a
//! budget too small.

use crate::common::headroom_in as headroom;
use std::path::Path;
use std::process::Output;

const TINY: [&str; 8] = [
    "train",
    "--model",
    "gpt-tiny",
    "--micro-batch",
    "4",
    "--eval-batches",
    "1",
    "--no-timeline",
];

fn tiny(extra: &[&str]) -> Vec<String> {
    TINY.iter().chain(extra).map(|s| s.to_string()).collect()
}

fn run(args: &[String], dir: &Path) -> Output {
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    headroom(&refs, dir)
}

/// Runs `args`, which must succeed, and reads the JSON report they write to `name`.
fn report_of(args: &[String], dir: &Path, name: &str) -> serde_json::Value {
    let out = run(args, dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
}

#[test]
fn json_report_has_every_member_and_the_peak_breakdown_sums() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &tiny(&["--steps", "3", "--json-report", "report.json"]),
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("| Allocated memory"), "summary table missing");
    assert!(text.contains("Validation loss"));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(v["losses"].as_array().unwrap().len(), 3);
    assert_eq!(v["step_times_s"].as_array().unwrap().len(), 3);
    assert!(!v["val_losses"].as_array().unwrap().is_empty());
    assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0);
    let categories = [
        "parameter",
        "gradient",
        "master_weight",
        "optimizer_state",
        "activation",
        "temporary",
        "input",
        "communication",
        "other",
    ];
    let mut sum = 0;
    for c in categories {
        assert!(v["peak_bytes_by_category"][c].is_u64(), "{c}");
        sum += v["breakdown"]["by_category"][c].as_u64().unwrap();
        assert!(v["breakdown"]["steady_by_category"][c].is_u64(), "{c}");
    }
    assert_eq!(
        sum,
        v["peak_allocated_bytes"].as_u64().unwrap(),
        "the breakdown at the peak sums to the peak"
    );
    assert!(v["peak_reserved_bytes"].as_u64().unwrap() >= sum);
    // The dry run's prediction sits next to the measurement, within 1 %.
    let predicted = v["predicted_peak_bytes"].as_u64().unwrap() as f64;
    assert!(
        (predicted - sum as f64).abs() <= 0.01 * sum as f64,
        "predicted {predicted} vs measured {sum}"
    );
    assert!(v["predicted_breakdown"]["by_category"]["activation"].is_u64());
    assert_eq!(v["config"]["model"], "gpt-tiny");
    assert_eq!(v["config"]["micro_batch"], 4);
    // fp32: no master weights; AdamW: two states per parameter, so optimizer bytes ≈ 2 × params.
    assert_eq!(v["peak_bytes_by_category"]["master_weight"], 0);
    let (params, states) = (
        v["peak_bytes_by_category"]["parameter"].as_u64().unwrap(),
        v["peak_bytes_by_category"]["optimizer_state"]
            .as_u64()
            .unwrap(),
    );
    assert_eq!(states, 2 * params);
}

#[test]
fn flags_override_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("run.toml"),
        "steps = 5\nmicro_batch = 2\nprecision = \"bf16-mixed\"\n",
    )
    .unwrap();
    let args = tiny(&[
        "--config",
        "run.toml",
        "--steps",
        "2",
        "--json-report",
        "r.json",
    ]);
    let v = report_of(&args, dir.path(), "r.json");
    assert_eq!(
        v["losses"].as_array().unwrap().len(),
        2,
        "--steps wins over the file"
    );
    assert_eq!(
        v["config"]["precision"], "bf16-mixed",
        "the file's precision is kept"
    );
    assert_eq!(
        v["config"]["micro_batch"], 4,
        "--micro-batch wins over the file"
    );
    assert!(
        v["peak_bytes_by_category"]["master_weight"]
            .as_u64()
            .unwrap()
            > 0
    );
}

#[test]
fn a_chunked_loss_is_read_from_the_file_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("run.toml"), "loss = \"chunked:4\"\n").unwrap();
    let args = tiny(&[
        "--config",
        "run.toml",
        "--steps",
        "1",
        "--json-report",
        "r.json",
    ]);
    let v = report_of(&args, dir.path(), "r.json");
    assert_eq!(v["config"]["loss"], "chunked:4");
    let out = run(&tiny(&["--steps", "1", "--loss", "chunked:1"]), dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--loss") && err.contains("chunked:K (K ≥ 2"),
        "{err}"
    );
}

#[test]
fn the_step_in_backward_holds_fewer_gradient_bytes_and_refuses_accumulation() {
    let dir = tempfile::tempdir().unwrap();
    let steps = ["--steps", "2", "--grad-clip", "0", "--json-report"];
    let plain = report_of(
        &tiny(&[&steps[..], &["plain.json"]].concat()),
        dir.path(),
        "plain.json",
    );
    let fused = report_of(
        &tiny(&[&["--optimizer-in-backward"], &steps[..], &["fused.json"]].concat()),
        dir.path(),
        "fused.json",
    );
    assert_eq!(fused["config"]["optimizer_in_backward"], true);
    assert_eq!(plain["losses"], fused["losses"], "the same step, bitwise");
    let grad = |v: &serde_json::Value| v["peak_bytes_by_category"]["gradient"].as_u64().unwrap();
    assert!(
        grad(&fused) < grad(&plain),
        "{} vs {}",
        grad(&fused),
        grad(&plain)
    );
    let out = run(
        &tiny(&[
            "--steps",
            "1",
            "--optimizer-in-backward",
            "--accumulation",
            "2",
        ]),
        dir.path(),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--accumulation 1"), "{err}");
}

#[test]
fn activation_offload_reports_the_host_bytes_and_needs_checkpointing() {
    let dir = tempfile::tempdir().unwrap();
    let args = tiny(&[
        "--steps",
        "2",
        "--checkpoint",
        "all",
        "--offload-activations",
        "cpu",
        "--json-report",
        "offload.json",
    ]);
    let out = run(&args, dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Activation offload:"), "{text}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("offload.json")).unwrap()).unwrap();
    assert_eq!(report["config"]["offload_activations"], "cpu");
    // gpt-tiny's two blocks keep inputs of micro-batch 4 × sequence 32 × width 32 in f32.
    assert_eq!(
        report["offloaded_activations_peak_bytes"],
        2 * 4 * 32 * 32 * 4
    );
    let out = run(
        &tiny(&[
            "--steps",
            "1",
            "--checkpoint",
            "none",
            "--offload-activations",
            "cpu",
        ]),
        dir.path(),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("checkpoints no block"), "{err}");
}

#[test]
fn malformed_config_names_the_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        "steps = 2\nlearning_rate = 0.1\n",
    )
    .unwrap();
    let out = run(&tiny(&["--config", "bad.toml"]), dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 2") && err.contains("learning_rate"),
        "{err}"
    );
}

#[test]
fn too_small_a_budget_exits_with_the_oom_message() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &tiny(&["--steps", "1", "--device-memory", "1MiB"]),
        dir.path(),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Tried to allocate") && err.contains("--device-memory"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn resume_continues_from_the_checkpoint_and_timeline_is_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &tiny(&["--steps", "2", "--checkpoint-dir", "ckpt"]),
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join("ckpt/step-000002/manifest.json").is_file());
    let mut args: Vec<String> = [
        "train",
        "--model",
        "gpt-tiny",
        "--micro-batch",
        "4",
        "--eval-batches",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(
        [
            "--steps",
            "4",
            "--resume",
            "ckpt",
            "--json-report",
            "r.json",
            "--timeline",
            "t.svg",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let out = run(&args, dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
    // Losses of steps 1–2 come from the checkpoint, 3–4 from this run.
    assert_eq!(v["losses"].as_array().unwrap().len(), 4);
    assert_eq!(v["step_times_s"].as_array().unwrap().len(), 2);
    assert!(
        std::fs::read_to_string(dir.path().join("t.svg"))
            .unwrap()
            .starts_with("<svg")
    );
    let out = run(&tiny(&["--steps", "4", "--resume", "nowhere"]), dir.path());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no saved run at"));
}

#[test]
fn data_parallel_ranks_train_the_same_run_as_one_process_accumulating() {
    // `--data-parallel 3` (each rank micro-batch 2) against one process accumulating three
    // micro-batches of 2, deterministic mode: the same losses, to the bit, in the reports.
    let dir = tempfile::tempdir().unwrap();
    let common = [
        "train",
        "--model",
        "gpt-tiny",
        "--dropout",
        "0",
        "--micro-batch",
        "2",
        "--steps",
        "4",
        "--eval-batches",
        "1",
        "--no-timeline",
        "--no-auto",
        "--deterministic",
    ];
    let mut ddp: Vec<&str> = common.to_vec();
    ddp.extend(["--data-parallel", "3", "--json-report", "ddp.json"]);
    let mut single: Vec<&str> = common.to_vec();
    single.extend(["--accumulation", "3", "--json-report", "single.json"]);
    for args in [&ddp, &single] {
        let out = headroom(args, dir.path());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.path().join(name)).unwrap()).unwrap()
    };
    let (a, b) = (read("ddp.json"), read("single.json"));
    assert_eq!(a["losses"], b["losses"]);
    assert_eq!(a["config"]["data_parallel"], 3);
}

#[test]
fn tensor_parallel_ranks_train_the_unsplit_run_and_report_the_mesh() {
    // `--tensor-parallel 2` (gpt-tiny's 2 heads, one per rank) against the unsplit layout
    // (`--tensor-parallel 1`), deterministic mode: the same losses, to the bit; the text report
    // names the mesh, and each rank's peak is the dry run's prediction.
    let dir = tempfile::tempdir().unwrap();
    let common = [
        "train",
        "--model",
        "gpt-tiny",
        "--dropout",
        "0",
        "--micro-batch",
        "2",
        "--steps",
        "3",
        "--eval-batches",
        "1",
        "--optimizer",
        "adamw",
        "--no-timeline",
        "--no-auto",
        "--deterministic",
    ];
    let mut outs = Vec::new();
    for (n, name) in [("2", "tp2.json"), ("1", "tp1.json")] {
        let mut args: Vec<&str> = common.to_vec();
        args.extend(["--tensor-parallel", n, "--json-report", name]);
        let out = headroom(&args, dir.path());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        outs.push(out);
    }
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.path().join(name)).unwrap()).unwrap()
    };
    let (split, whole) = (read("tp2.json"), read("tp1.json"));
    assert_eq!(split["losses"], whole["losses"]);
    assert_eq!(split["losses"].as_array().unwrap().len(), 3);
    let text = String::from_utf8_lossy(&outs[0].stdout);
    assert!(text.contains("Mesh: tp 2 × dp 1"), "{text}");
    let ranks = split["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for r in ranks {
        assert_eq!(
            r["peak_allocated_bytes"], split["predicted_peak_bytes"],
            "{r}"
        );
    }
}
