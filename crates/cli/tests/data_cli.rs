//! `headroom data prepare` end to end: a text prepared byte-level trains exactly as the text
//! does, with any number of loader workers; a damaged token file or an empty directory ends
//! with a non-zero exit that names the file and the fix.

use crate::common::{headroom_in as headroom, stderr};
use std::path::Path;
use std::process::Output;

/// 20,000 bytes of text: enough windows of the tiny GPT's 32 tokens.
fn write_text(dir: &Path) {
    let text: String = (0..2000).map(|i| format!("line {i:04}\n")).collect();
    assert_eq!(text.len(), 20_000);
    std::fs::write(dir.join("text.txt"), text).unwrap();
}

fn train(dir: &Path, data: &str, workers: &str, report: &str) -> Output {
    headroom(
        &[
            "train",
            "--model",
            "gpt-tiny",
            "--micro-batch",
            "4",
            "--eval-batches",
            "1",
            "--no-timeline",
            "--steps",
            "3",
            "--data",
            data,
            "--workers",
            workers,
            "--json-report",
            report,
        ],
        dir,
    )
}

fn json(dir: &Path, file: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join(file)).unwrap()).unwrap()
}

#[test]
fn a_prepared_text_trains_exactly_as_the_text_with_any_workers() {
    let dir = tempfile::tempdir().unwrap();
    write_text(dir.path());
    let out = headroom(
        &["data", "prepare", "text.txt", "--out", "text.bin", "--json"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let prepared: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Byte-level: one token per byte, two bytes each after a 64-byte header.
    assert_eq!(prepared["tokens"], 20_000);
    assert_eq!(prepared["file_bytes"], 64 + 2 * 20_000);
    assert_eq!(
        std::fs::metadata(dir.path().join("text.bin"))
            .unwrap()
            .len(),
        40_064
    );
    let text = train(dir.path(), "text.txt", "0", "text.json");
    assert!(text.status.success(), "{}", stderr(&text));
    let tokens = train(dir.path(), "text.bin", "2", "tokens.json");
    assert!(tokens.status.success(), "{}", stderr(&tokens));
    let (a, b) = (
        json(dir.path(), "text.json"),
        json(dir.path(), "tokens.json"),
    );
    assert_eq!(a["losses"], b["losses"]);
    assert_eq!(b["loader"]["source"], "token file");
    assert_eq!(b["loader"]["workers"], 2);
    assert_eq!(b["loader"]["batches"], 3);
    assert_eq!(a["loader"]["source"], "text");
    assert!(b["host"]["peak_rss_bytes"].as_u64().unwrap() > 0);
    let report = String::from_utf8_lossy(&tokens.stdout);
    assert!(report.contains("Data: token file, 2 workers"), "{report}");
}

#[test]
fn a_truncated_token_file_is_named_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    write_text(dir.path());
    let out = headroom(
        &["data", "prepare", "text.txt", "--out", "t.bin"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let bytes = std::fs::read(dir.path().join("t.bin")).unwrap();
    std::fs::write(dir.path().join("t.bin"), &bytes[..30_000]).unwrap();
    let out = train(dir.path(), "t.bin", "1", "r.json");
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("t.bin") && e.contains("truncated") && e.contains("headroom data prepare"),
        "{e}"
    );
}

#[test]
fn preparing_an_empty_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let out = headroom(&["data", "prepare", "empty", "--out", "e.bin"], dir.path());
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no regular files"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("e.bin").exists());
}
