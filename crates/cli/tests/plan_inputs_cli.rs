//! `headroom plan` inputs end to end: a sequence beyond the model's trained context (warned),
//! a measured step to calibrate against, and the levers planned but not trained or carried into
//! the step time (selective-op checkpointing, compile, what `zero_grad()` does).

use crate::common;

use common::{headroom, json, output_text, stderr};
use serde_json::Value;

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

#[test]
fn zero_grad_says_whether_a_step_starts_with_its_gradients() {
    // GPT-2 fp32 under FSDP, one micro-batch a step: `--zero-grad zero-fill` (PyTorch before
    // 2.0) holds every fp32 gradient through the step, 4 × 124,439,808 bytes at the peak; the
    // default frees them between steps, so fewer are held at its peak. The report says so.
    let pinned = "--seq-len 1024 --framework fsdp --precision fp32 --optimizer adamw --zero 0 \
                  --checkpoint none --attention memory-efficient --loss chunked:64 \
                  --micro-batch 8 --accumulation 1";
    let run = |zero_grad: &str, extra: &[&str]| {
        let mut args = vec!["plan", "--model", "gpt2", "--gpu", "A100-80GB"];
        args.extend(pinned.split_whitespace());
        args.extend(["--zero-grad", zero_grad]);
        args.extend(extra);
        let o = headroom(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        o
    };
    let gradient = |zero_grad| {
        let v = json(&run(zero_grad, &["--json"]));
        v["recommended"]["memory"]["by_category"]["gradient"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(gradient("zero-fill"), 4 * 124_439_808);
    assert!(gradient("set-to-none") < 4 * 124_439_808);
    let text = output_text(&run("zero-fill", &[]));
    assert!(
        text.contains("gradients zero-filled between steps"),
        "{text}"
    );
    let bad: Vec<&str> = "plan --model gpt2 --gpu A100-80GB --zero-grad none"
        .split_whitespace()
        .collect();
    let o = headroom(&bad);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("set-to-none, zero-fill"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_loop_that_keeps_outputs_is_an_input_of_the_plan() {
    // GPT-2 in bf16 at 8 × 1,024 tokens: a loop that keeps `outputs` holds the model's bf16
    // logits through backward, 2·8·1,024·50,257 = 823,410,688 bytes of activations more at the
    // peak; the report's layout says so, and a value other than true or false is refused.
    let pinned = "plan --model gpt2 --gpu A100-80GB --seq-len 1024 --framework fsdp \
                  --precision bf16 --optimizer adamw --zero 0 --checkpoint none \
                  --attention memory-efficient --micro-batch 8 --accumulation 1";
    let run = |kept: &str, extra: &[&str]| {
        let mut args: Vec<&str> = pinned.split_whitespace().collect();
        args.extend(["--loop-keeps-outputs", kept]);
        args.extend(extra);
        headroom(&args)
    };
    let activation = |kept| {
        let o = run(kept, &["--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["recommended"]["memory"]["by_category"]["activation"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(activation("true") - activation("false"), 823_410_688);
    let text = output_text(&run("true", &[]));
    assert!(text.contains("the loop keeps the model's output"), "{text}");
    let o = run("yes", &[]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--loop-keeps-outputs"),
        "{}",
        stderr(&o)
    );
}
