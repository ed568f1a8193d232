//! `headroom memory replay` end to end: JSON output with PyTorch's stat keys, OOM events under a
//! capacity, the expandable allocator serving a fragmented trace, and clear errors for bad traces.

use crate::common::headroom;
use std::path::Path;
use std::process::Command;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// 5 MiB, 5 MiB, free the first, then 12 MiB: with fixed segments the first 20 MiB segment is
/// split and pinned, so the 12 MiB request needs a new 12 MiB segment.
const FRAGMENTING: &str = r#"[
 {"action":"alloc","addr":1,"size":5242880},
 {"action":"alloc","addr":2,"size":5242880},
 {"action":"free","addr":1},
 {"action":"alloc","addr":3,"size":12582912,"category":"activation"},
 {"action":"free","addr":2},
 {"action":"free","addr":3}
]"#;

#[test]
fn json_report_has_pytorch_stat_keys_with_integer_values() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.json", FRAGMENTING);
    let out = headroom(&["memory", "replay", &trace, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let stats = &v["stats"];
    // 20 MiB shared segment + 12 MiB dedicated segment, never released.
    assert_eq!(stats["reserved_bytes.all.peak"], 32 << 20);
    assert_eq!(stats["reserved_bytes.large_pool.current"], 32 << 20);
    // Peak allocated: 5 + 12 MiB after the first free.
    assert_eq!(stats["allocated_bytes.all.peak"], 17 << 20);
    assert_eq!(stats["allocated_bytes.all.current"], 0);
    assert_eq!(stats["requested_bytes.all.peak"], 17 << 20);
    assert_eq!(stats["active_bytes.all.freed"], 22 << 20);
    assert_eq!(stats["allocation.all.allocated"], 3);
    assert_eq!(stats["segment.all.current"], 2);
    assert_eq!(stats["num_ooms"], 0);
    for key in [
        "inactive_split_bytes.all.current",
        "num_alloc_retries",
        "num_device_alloc",
        "num_device_free",
        "oversize_allocations.current",
        "oversize_segments.peak",
    ] {
        assert!(stats[key].is_i64(), "{key} missing or not an integer");
    }
}

/// The pattern of pytorch/pytorch#35901 at 300 MiB: a 100 MiB segment is cached, then carved by
/// 50 and 30 MiB tensors; the 30 MiB one stays alive and pins the segment.
const PINNED: &str = r#"[
 {"action":"alloc","addr":1,"size":104857600},
 {"action":"free","addr":1},
 {"action":"alloc","addr":2,"size":52428800},
 {"action":"alloc","addr":3,"size":31457280},
 {"action":"free","addr":2},
 {"action":"alloc","addr":4,"size":125829120},
 {"action":"alloc","addr":5,"size":104857600}
]"#;

#[test]
fn capacity_turns_unservable_allocations_into_oom_events_and_expandable_avoids_them() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.json", PINNED);
    // Fixed segments: 50 and 30 MiB split the cached 100 MiB segment; after freeing the 50 MiB
    // block, 50 + 20 MiB are free but pinned by the live 30 MiB block. 120 MiB gets a new
    // segment (100 + 120 ≤ 300), and 100 MiB more would need 320 MiB: the flush releases
    // nothing (the only cached blocks are in a split segment) → one counted retry, one OOM at
    // event 6 with 70 MiB reserved but unallocated.
    let out = headroom(&["memory", "replay", &trace, "--capacity", "300MiB", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stats"]["num_ooms"], 1);
    assert_eq!(v["stats"]["num_alloc_retries"], 1);
    assert_eq!(v["outcome"]["ooms"][0]["event_index"], 6);
    assert_eq!(v["stats"]["inactive_split_bytes.all.current"], 70 << 20);
    // Expandable segments (20 MiB pages): the freed 100 MiB merges with the free tail, 50 and 30
    // MiB reuse pages 0–3, 120 MiB continues at 80 MiB (maps pages 5–9: 200 MiB reserved), and
    // the last 100 MiB maps pages 10–14: exactly 300 MiB reserved, no OOM.
    let out = headroom(&[
        "memory",
        "replay",
        &trace,
        "--capacity",
        "300MiB",
        "--allocator",
        "expandable",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allocator"], "expandable");
    assert_eq!(v["stats"]["num_ooms"], 0);
    assert_eq!(v["stats"]["reserved_bytes.all.peak"], 300 << 20);
    assert_eq!(v["stats"]["allocated_bytes.all.current"], 250 << 20);
}

#[test]
fn the_planned_arena_reserves_the_packed_peak() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.json", FRAGMENTING);
    // Lifetimes: 5 MiB (events 0–2), 5 MiB (1–4), 12 MiB (3–5); at most 5 + 12 = 17 MiB live.
    // Largest first: the 12 MiB block at offset 0, the second 5 MiB (live with it) at 12 MiB,
    // the first 5 MiB (live only with the second) best-fit into the gap at 0: a 17 MiB arena.
    // The caching allocator needs a 20 MiB segment and a 12 MiB one.
    let out = headroom(&[
        "memory",
        "replay",
        &trace,
        "--allocator",
        "planned",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allocator"], "planned");
    assert_eq!(v["stats"]["reserved_bytes.all.peak"], 17 << 20);
    assert_eq!(v["stats"]["allocated_bytes.all.peak"], 17 << 20);
    assert_eq!(v["arena"]["windows_as_planned"], 1);
    let out = headroom(&["memory", "replay", &trace, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stats"]["reserved_bytes.all.peak"], 32 << 20);
}

#[test]
fn text_report_shows_the_summary_table() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.json", FRAGMENTING);
    let out = headroom(&["memory", "replay", &trace]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("| Allocated memory      |"), "{text}");
    assert!(text.contains("Non-releasable memory"));
    assert!(text.contains("| activation"));
    assert!(text.contains("Largest free block"));
}

#[test]
fn bad_traces_fail_with_the_event_index() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            r#"[{"action":"alloc","addr":1,"size":512},{"action":"explode","addr":1}]"#,
            "event 1: unknown action",
        ),
        (
            r#"[{"action":"free","addr":9}]"#,
            "event 0: free of unknown id 9",
        ),
        (
            r#"[{"action":"alloc","addr":1,"size":-1}]"#,
            "negative size",
        ),
        (r#"[{"action":"alloc","addr":1,"#, "truncated"),
    ];
    for (i, (text, needle)) in cases.into_iter().enumerate() {
        let trace = write(dir.path(), &format!("bad{i}.json"), text);
        let out = headroom(&["memory", "replay", &trace]);
        assert!(!out.status.success(), "{text} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{text}: {err}");
    }
    let out = headroom(&["memory", "replay", "/definitely/not/here.json"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read trace file"));
    let trace = write(dir.path(), "ok.json", FRAGMENTING);
    let out = headroom(&["memory", "replay", &trace, "--capacity", "lots"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("GiB = 2^30"));
}

#[test]
fn snapshot_of_a_replay_replays_again() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.json", FRAGMENTING);
    let snap = dir.path().join("replay.pickle");
    let out = headroom(&[
        "memory",
        "replay",
        &trace,
        "--snapshot",
        snap.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let out = headroom(&["memory", "replay", snap.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["format"], "pytorch_snapshot");
    assert_eq!(v["stats"]["allocated_bytes.all.peak"], 17 << 20);
}

#[test]
fn timeline_picture_is_an_svg_with_every_used_category() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "t.json", FRAGMENTING);
    let svg = dir.path().join("timeline.svg");
    let out = headroom(&[
        "memory",
        "replay",
        &trace,
        "--capacity",
        "64MiB",
        "--timeline",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "not an SVG");
    // The trace tags one allocation `activation` and the others default to `other`.
    // plotters writes each legend entry as a <text> element holding the label on its own line.
    let legend = |label: &str| text.contains(&format!(">\n{label}\n</text>"));
    for label in ["activation", "other", "reserved", "capacity"] {
        assert!(legend(label), "legend lacks {label}");
    }
    assert!(
        !legend("gradient"),
        "unused categories stay out of the legend"
    );
}

#[test]
fn bench_checkpoint_rejects_arguments_it_cannot_measure() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["bench", "checkpoint", "--repeats", "0"],
        vec!["bench", "checkpoint", "--micro-batch", "0"],
        vec!["bench", "checkpoint", "--depths", "16"],
        vec!["bench", "checkpoint", "--depths", "0,16"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(&args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// A traced step's labels: 4 MiB of activations in forward, 6 MiB of gradients in backward
/// after 2 MiB of them is freed (8 MiB live), then 1 MiB in the optimizer (9 MiB, the peak).
const LABELLED: &str = r#"[
 {"action":"alloc","addr":1,"size":4194304,"category":"activation","phase":"forward","step":0,"module":"model.h.0","op":"aten::mm","dtype":"float32"},
 {"action":"free","addr":1,"phase":"backward"},
 {"action":"alloc","addr":2,"size":2097152,"category":"activation","phase":"forward","step":0},
 {"action":"alloc","addr":3,"size":6291456,"category":"gradient","phase":"backward","step":0,"module":"model.h.0","op":"aten::mm"},
 {"action":"alloc","addr":4,"size":1048576,"category":"optimizer_state","phase":"optimizer","step":0,"op":"aten::zeros_like"}
]"#;

#[test]
fn the_allocation_at_the_peak_is_named_with_its_phase_module_and_op() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write(dir.path(), "labelled.json", LABELLED);
    let out = headroom(&["memory", "replay", &trace, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stats"]["allocated_bytes.all.peak"], 9 << 20);
    let peak = &v["at_peak"];
    assert_eq!(peak["event"], 4);
    assert_eq!(peak["size"], 1 << 20);
    assert_eq!(peak["category"], "optimizer_state");
    assert_eq!(peak["phase"], "optimizer");
    assert_eq!(peak["step"], 0);
    assert_eq!(peak["op"], "aten::zeros_like");
    assert!(peak.get("module").is_none(), "{peak}");

    let out = headroom(&["memory", "replay", &trace]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("The allocated peak is reached in optimizer (step 0), op aten::zeros_like."),
        "{text}"
    );
}
