//! A closed stdout (`headroom … | head -1`) ends a command quietly: killed by SIGPIPE (141 in a
//! shell) or exit 0, never a panic (exit 101 with a backtrace).

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

#[test]
fn a_closed_stdout_ends_commands_quietly() {
    for args in [
        &["params", "--model", "t5-3b"][..],
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
        ],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run headroom");
        // Close the reading end before the command writes its first line.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("headroom ends");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        let quiet = out.status.success() || out.status.signal() == Some(libc_sigpipe());
        assert!(quiet, "{args:?}: {:?} {stderr}", out.status);
    }
}

/// SIGPIPE's number on Linux and the BSDs.
fn libc_sigpipe() -> i32 {
    13
}
