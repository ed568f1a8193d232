//! `headroom plan --trace` before any Python runs: the inputs it cannot trace are one clear line
//! each, and a missing interpreter names HEADROOM_PYTHON. (The traced path itself runs Python
//! and is tested in python/tests/test_plan_trace_cli.py.)

use std::process::{Command, Output};

fn plan_trace(args: &[&str], python: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(["plan", "--trace"])
        .args(args)
        .env("HEADROOM_PYTHON", python)
        .output()
        .unwrap()
}

fn config(dir: &std::path::Path) -> String {
    let path = dir.join("config.json");
    std::fs::write(
        &path,
        r#"{"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 1000}"#,
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn a_missing_interpreter_names_headroom_python() {
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("no-such-python");
    let model = config(dir.path());
    let out = plan_trace(&[&model, "--gpu", "H100-80GB", "--seq-len", "8"], &python);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot run Python '{}'", python.display()))
            && err.contains("HEADROOM_PYTHON"),
        "{err}"
    );
}

#[test]
fn inputs_it_cannot_trace_are_refused_before_tracing() {
    let dir = tempfile::tempdir().unwrap();
    let python = dir.path().join("no-such-python");
    let model = config(dir.path());
    let cases: [(&[&str], &str); 5] = [
        (
            &["pkg.models:build", "--gpu", "H100-80GB", "--seq-len", "8"],
            "give --model CONFIG.json",
        ),
        (
            &[
                &model,
                "--gpu",
                "H100-80GB",
                "--seq-len",
                "8",
                "--checkpoint",
                "sqrt",
            ],
            "--checkpoint sqrt is not traced yet",
        ),
        (
            &[
                &model,
                "--gpu",
                "H100-80GB",
                "--seq-len",
                "8",
                "--global-batch",
                "6",
                "--micro-batch",
                "4",
            ],
            "--micro-batch 4 does not divide the 6 samples per GPU",
        ),
        (
            &[
                &model,
                "--gpu",
                "H100-80GB",
                "--gpus-per-node",
                "8",
                "--seq-len",
                "8",
                "--global-batch",
                "8",
                "--zero",
                "1",
            ],
            "--zero 1 is not traced on several GPUs yet",
        ),
        (
            &[
                &model,
                "--gpu",
                "H100-80GB",
                "--gpus-per-node",
                "8",
                "--seq-len",
                "8",
                "--global-batch",
                "6",
            ],
            "the global batch of 6 samples does not split over 8 GPUs",
        ),
    ];
    for (args, message) in cases {
        let out = plan_trace(args, &python);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(message),
            "{args:?}: {err}"
        );
        assert!(!err.contains("cannot run Python"), "{args:?}: {err}");
    }
}
