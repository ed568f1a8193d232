//! Signals: the first SIGTERM (or SIGINT, SIGHUP) finishes the step in progress, saves, writes
//! the report, prints the resume command and exits with 128 + the signal; the saved run
//! resumes. A second signal ends the process at once.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Starts a long run and returns once it has finished its first step, with the run's
/// acknowledgements of stop signals (its stderr lines `headroom: … received: …`) as they come.
fn start(dir: &std::path::Path, model: &str) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "train",
            "--model",
            model,
            "--no-auto",
            "--micro-batch",
            "2",
            "--steps",
            "100000",
            "--eval-batches",
            "1",
            "--no-timeline",
            "--json-report",
            "r.json",
        ])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run headroom");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        if line.unwrap().starts_with("step 1/") {
            break;
        }
    }
    // Keep draining stderr so the run never blocks on a full pipe.
    let (send, acknowledged) = mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if line.starts_with("headroom: ") && line.contains(" received: ") {
                let _ = send.send(line);
            }
        }
    });
    (child, acknowledged)
}

fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            started.elapsed() < limit,
            "the run did not stop in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn sigterm_saves_reports_and_exits_143_and_the_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _) = start(dir.path(), "gpt-tiny");
    signal(&child, libc::SIGTERM);
    let status = wait(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(143), "{status:?}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("r.json")).unwrap()).unwrap();
    let step = report["stopped_at_step"]
        .as_u64()
        .expect("the report says where it stopped");
    assert_eq!(report["losses"].as_array().unwrap().len() as u64, step);
    let saved = dir
        .path()
        .join(format!("headroom-save/step-{step:06}/manifest.json"));
    assert!(saved.is_file(), "no save at {}", saved.display());
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(["train", "--resume", "headroom-save", "--steps"])
        .arg((step + 1).to_string())
        .args(["--no-timeline", "--eval-batches", "1"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_second_sigint_exits_at_once_with_130() {
    let dir = tempfile::tempdir().unwrap();
    // gpt-medium's steps take long enough that both signals land within one.
    let (mut child, acknowledged) = start(dir.path(), "gpt-medium");
    signal(&child, libc::SIGINT);
    // Two pending SIGINTs merge into one: send the second only once the run has said it
    // received the first.
    let said = acknowledged
        .recv_timeout(Duration::from_secs(10))
        .expect("the run acknowledges the first signal on stderr");
    assert!(
        said.contains("SIGINT received") && said.contains("send it again"),
        "{said}"
    );
    signal(&child, libc::SIGINT);
    let status = wait(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(
        !dir.path().join("headroom-save").exists(),
        "the second signal does not wait for a save"
    );
}
