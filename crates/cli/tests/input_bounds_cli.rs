//! Inputs that must not take the machine down: `data prepare` stopped by SIGINT removes its
//! unfinished token file and exits 130; a FIFO or a device given to `data prepare` is refused at
//! once; `--prefetch` and `--collective-timeout` out of range end with the limit and the fix
//! (not an abort or a panic); a huge name in a trace is not echoed whole.

use crate::common::stderr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

fn headroom(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_headroom"));
    c.args(args).current_dir(dir);
    c
}

/// Waits for `child`, failing the test if it runs past `limit`.
fn wait(child: &mut Child, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("headroom did not end in {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn sigint_during_data_prepare_removes_the_temporary_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    // 32 MiB of text: seconds of tokenizing, so the signal comes while the file is written.
    let line = "Of Mans First Disobedience, and the Fruit\n";
    let text = line.repeat((32 << 20) / line.len());
    std::fs::write(dir.path().join("text.txt"), text).unwrap();
    let mut child = headroom(
        &["data", "prepare", "text.txt", "--out", "t.bin"],
        dir.path(),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // The hidden temporary beside t.bin appears once the header is written.
    let started = Instant::now();
    while !listing(dir.path())
        .iter()
        .any(|n| n.starts_with(".t.bin.tmp"))
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "ended before the signal"
        );
        assert!(started.elapsed() < Duration::from_secs(60), "no temporary");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = wait(&mut child, Duration::from_secs(60));
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}: {err}");
    assert!(
        err.contains("interrupted by SIGINT") && err.contains("nothing was written at t.bin"),
        "{err}"
    );
    assert_eq!(listing(dir.path()), ["text.txt"]);
}

#[test]
fn a_fifo_or_dev_zero_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (input, kind) in [("pipe", "a FIFO"), ("/dev/zero", "a character device")] {
        let mut child = headroom(&["data", "prepare", input, "--out", "t.bin"], dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Reading either would block or never end: the refusal comes before any read.
        let status = wait(&mut child, Duration::from_secs(30));
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(1), "{input}: {err}");
        assert!(
            err.contains(kind)
                && err.contains("not a regular file")
                && err.contains("--allow-stream"),
            "{err}"
        );
        assert_eq!(listing(dir.path()), ["pipe"]);
    }
    // Allowed, /dev/zero is bounded by --max-tokens, and nothing is left behind.
    let out = headroom(
        &[
            "data",
            "prepare",
            "/dev/zero",
            "--allow-stream",
            "--max-tokens",
            "1000",
            "--out",
            "t.bin",
        ],
        dir.path(),
    )
    .output()
    .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("more than --max-tokens 1000 tokens"), "{err}");
    assert_eq!(listing(dir.path()), ["pipe"]);
}

#[test]
fn prefetch_and_collective_timeout_out_of_range_name_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (["--prefetch", "100000"], "64 or less"),
        (["--collective-timeout", "1e300"], "604800"),
        (["--collective-timeout", "inf"], "604800"),
        (["--collective-timeout", "NaN"], "604800"),
        (["--collective-timeout", "0"], "604800"),
    ];
    for (flags, needle) in cases {
        // With a worker, --prefetch 100000 aborted allocating its staging buffers.
        let mut args = vec![
            "train",
            "--model",
            "gpt-tiny",
            "--steps",
            "1",
            "--no-timeline",
            "--workers",
            "1",
        ];
        args.extend(flags);
        let out = headroom(&args, dir.path()).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {err}");
        assert!(err.contains(needle) && !err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_huge_category_in_a_trace_is_not_echoed_whole() {
    let dir = tempfile::tempdir().unwrap();
    let name = "c".repeat(1 << 20);
    let trace = format!(r#"[{{"action":"alloc","addr":1,"size":512,"category":"{name}"}}]"#);
    std::fs::write(dir.path().join("trace.json"), trace).unwrap();
    let out = headroom(&["memory", "replay", "trace.json"], dir.path())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{}", &err[..err.len().min(300)]);
    assert!(err.contains("unknown memory category") && err.contains("… (1048576 bytes)"));
    assert!(err.len() < 1_000, "an error of {} bytes", err.len());
}
