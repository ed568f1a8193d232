//! Output files and the terminal: `--json-report /dev/stdout` writes through to the pipe
//! (never replacing the device), an unwritable output is refused before training, a closed
//! stdout (`headroom … | head -1`) ends any command quietly and loses no file, hostile sizes
//! are clear errors, and an OS error is said once.

use crate::common::headroom_in as headroom;
use std::process::{Command, Stdio};

const TINY: [&str; 9] = [
    "train",
    "--model",
    "gpt-tiny",
    "--steps",
    "1",
    "--eval-batches",
    "1",
    "--no-auto",
    "--no-timeline",
];

#[test]
fn a_report_to_dev_stdout_goes_down_the_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = TINY.to_vec();
    args.extend(["--json-report", "/dev/stdout"]);
    let out = headroom(&args, dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"losses\""), "{stdout}");
    assert!(
        std::fs::symlink_metadata("/dev/stdout")
            .unwrap()
            .file_type()
            .is_symlink(),
        "/dev/stdout is still the system's link"
    );
}

#[test]
fn an_unwritable_output_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, path) in [
        ("--json-report", "missing/r.json"),
        ("--snapshot", "."),
        ("--save-dir", "/proc/headroom-cannot-be-here"),
    ] {
        let mut args = TINY.to_vec();
        args.extend([flag, path]);
        let out = headroom(&args, dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {path}");
        assert!(
            stderr.contains(flag) && stderr.contains("cannot be written"),
            "{stderr}"
        );
        assert!(
            !stderr.contains("step 1/"),
            "refused before training: {stderr}"
        );
    }
}

/// Runs `args` with stdout closed before the command writes anything; returns its status and
/// stderr.
fn with_closed_stdout(args: &[&str], dir: &std::path::Path) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_ends_commands_quietly_and_loses_no_report() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let mut train = TINY.to_vec();
    train.extend(["--json-report", "r.json"]);
    let plan = [
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "1024",
        "--global-batch",
        "8",
    ];
    for args in [&["params", "--model", "t5-3b"][..], &plan, &train] {
        let (status, stderr) = with_closed_stdout(args, dir.path());
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        // Killed by SIGPIPE (13; 141 in a shell) or exit 0: never a panic's 101.
        assert!(
            status.success() || status.signal() == Some(13),
            "{args:?}: {status:?}"
        );
    }
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
    assert_eq!(v["losses"].as_array().unwrap().len(), 1);
}

#[test]
fn hostile_sizes_are_clear_errors_not_exhausted_hosts() {
    let dir = tempfile::tempdir().unwrap();
    // A billion layers: refused by the model's limits before anything is allocated.
    let out = headroom(
        &["train", "--layers", "1000000000", "--no-auto"],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("layers 1000000000 is above the limit"),
        "{stderr}"
    );
    // 3 TiB of weights inside a 1 PB budget: the dry run's peak is more than any host has.
    let out = headroom(
        &[
            "train",
            "--model",
            "gpt-tiny",
            "--layers",
            "4",
            "--width",
            "65536",
            "--heads",
            "64",
            "--micro-batch",
            "1",
            "--device-memory",
            "1PB",
            "--no-auto",
            "--steps",
            "1",
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("this machine has available"), "{stderr}");
    // A trillion-sample batch: refused at once, not searched for minutes.
    let out = headroom(
        &[
            "plan",
            "--model",
            "gpt2",
            "--gpu",
            "A100-80GB",
            "--seq-len",
            "1024",
            "--global-batch",
            "1000000000000",
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("planner's limits"), "{stderr}");
}

#[test]
fn an_os_error_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["train", "--config", "missing.toml"][..],
        &[
            "train",
            "--data",
            "missing.txt",
            "--no-auto",
            "--steps",
            "1",
        ],
        &[
            "plan",
            "--model",
            "gpt2",
            "--gpu",
            "A100-80GB",
            "--seq-len",
            "1024",
            "--global-batch",
            "8",
            "--emit",
            "deepspeed",
            "missing/ds.json",
        ],
    ] {
        let out = headroom(args, dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert_eq!(
            stderr.matches("(os error 2)").count(),
            1,
            "{args:?}: {stderr}"
        );
    }
}

/// A disk that fills while training (here `/dev/full`, which answers every write with ENOSPC)
/// loses neither the text report nor the outputs that could be written: each output is tried,
/// the report is printed, and the run ends non-zero naming what failed.
#[test]
fn a_full_disk_at_the_end_costs_neither_the_report_nor_the_other_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("snap.pickle");
    let mut args = TINY.to_vec();
    args.extend(["--json-report", "/dev/full", "--snapshot"]);
    args.push(snapshot.to_str().unwrap());
    let out = headroom(&args, dir.path());
    assert!(!out.status.success(), "a lost JSON report must not exit 0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/dev/full"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("predicted at the peak"),
        "the text report is lost: {stdout}"
    );
    assert!(
        std::fs::metadata(&snapshot).unwrap().len() > 0,
        "the snapshot, written after the failing picture or before the report, is lost"
    );
}
