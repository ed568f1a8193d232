//! How a group of ranks ends when one fails, end to end on threads (`--data-parallel 3`), with
//! faults injected through `HEADROOM_FAULT=RANK:KIND@STEP`: an error or a panic on rank 1 at
//! step 3 ends every rank, non-zero, naming rank 1 and what happened, within 5 s of the time a
//! healthy run takes to get there; a rank that sleeps is ended by the collective deadline
//! (`--collective-timeout`), naming it, within the deadline + 5 s. The same under `mpirun` is
//! `scripts/mpi-check.sh`; mismatched collectives are `crates/comm/tests/thread_group.rs`.

use crate::common::stderr;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const RUN: [&str; 11] = [
    "train",
    "--model",
    "gpt-tiny",
    "--micro-batch",
    "2",
    "--eval-batches",
    "1",
    "--no-timeline",
    "--no-auto",
    "--data-parallel",
    "3",
];

/// Runs `headroom` with `fault` injected (none when empty) in a fresh directory; its output and
/// wall time.
fn run(fault: &str, extra: &[&str]) -> (Output, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_headroom"));
    cmd.args(RUN).args(extra).current_dir(dir.path());
    if fault.is_empty() {
        cmd.env_remove("HEADROOM_FAULT");
    } else {
        cmd.env("HEADROOM_FAULT", fault);
    }
    let started = Instant::now();
    let out = cmd.output().expect("run headroom");
    (out, started.elapsed())
}

/// How long a healthy run of the same group takes to finish 3 steps (start-up included).
fn healthy_three_steps() -> Duration {
    let (out, took) = run("", &["--steps", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    took
}

#[test]
fn an_error_or_a_panic_on_one_rank_ends_every_rank_naming_it() {
    let healthy = healthy_three_steps();
    for (fault, says) in [
        ("1:error@3", "rank 1: injected fault at step 3"),
        ("1:panic@3", "rank 1 panicked"),
    ] {
        let (out, took) = run(fault, &["--steps", "8"]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{fault}: {err}");
        assert!(err.contains(says), "{fault}: {err}");
        assert!(
            took < healthy + Duration::from_secs(5),
            "{fault}: ended after {took:?}, a healthy run reaches step 3 in {healthy:?}"
        );
    }
}

#[test]
fn a_stuck_rank_is_ended_by_the_collective_deadline_naming_it() {
    let healthy = healthy_three_steps();
    let (out, took) = run("2:sleep@3", &["--steps", "8", "--collective-timeout", "2"]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("timed out after 2s waiting for rank(s) [2]"),
        "{err}"
    );
    assert!(
        took < healthy + Duration::from_secs(2 + 5),
        "ended after {took:?}; a healthy run reaches step 3 in {healthy:?}, the deadline is 2 s"
    );
}
