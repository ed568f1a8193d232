//! `headroom memory doctor` end to end: the side JSON's levers and what does not match the
//! trace, the HTML page, and bad input (a truncated or foreign pickle, a snapshot without
//! frames, a side JSON that is wrong) answered with a clear error or a diagnosis that says what
//! it could not attribute.
//!
//! The trace is a loop that sums its loss tensor (`total_loss += loss` at train.py:22), with the
//! frames PyTorch records: parameters 4 + 1 MiB made at train.py:10, a 512-byte loss made at
//! train.py:21 and kept every step.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

const TRAIN_PY: &str = "import torch\n\n\n\n\n\n\n\n\nmodel = Model().cuda()\n\n\n\n\n\n\n\n\nfor x, y in data:\n    logits = model(x)\n    loss = F.cross_entropy(logits, y)\n    total_loss += loss\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n";

fn user(line: i64) -> Value {
    json!({"filename": "train.py", "line": line, "name": "main"})
}

fn lib(file: &str, name: &str) -> Value {
    json!({"filename": format!("/usr/lib/python3/site-packages/torch/{file}"), "line": 1, "name": name})
}

/// Five steps of the loop: forward (2 MiB activation, 3 MiB logits, the loss), backward
/// (gradients 4 + 1 MiB at the first step), AdamW (states 2 × 5 MiB at the first step),
/// zero_grad frees the gradients; the loss is never freed.
fn trace() -> Vec<u8> {
    let mut ev: Vec<Value> = Vec::new();
    let mut next = 0u64;
    let mut alloc = |ev: &mut Vec<Value>, size: u64, frames: Vec<Value>| {
        next += 1;
        ev.push(json!({"action": "alloc", "addr": next, "size": size, "frames": frames}));
        next
    };
    let free = |ev: &mut Vec<Value>, addr: u64, frames: Vec<Value>| {
        ev.push(json!({"action": "free", "addr": addr, "frames": frames}));
    };
    let setup = || vec![lib("nn/modules/module.py", "cuda"), user(10)];
    let fwd = || vec![lib("nn/modules/linear.py", "forward"), user(20)];
    let opt = || vec![lib("optim/adamw.py", "_multi_tensor_adamw"), user(24)];
    let zero = || vec![lib("optim/optimizer.py", "zero_grad"), user(25)];
    alloc(&mut ev, 4 * MIB, setup());
    alloc(&mut ev, MIB, setup());
    let mut logits: Option<u64> = None;
    for step in 0..5 {
        let act = alloc(&mut ev, 2 * MIB, fwd());
        let l = alloc(&mut ev, 3 * MIB, fwd());
        if let Some(old) = logits.replace(l) {
            free(&mut ev, old, vec![user(20)]);
        }
        alloc(
            &mut ev,
            512,
            vec![lib("nn/functional.py", "cross_entropy"), user(21)],
        );
        let g = [alloc(&mut ev, 4 * MIB, vec![]), alloc(&mut ev, MIB, vec![])];
        free(&mut ev, act, vec![]);
        if step == 0 {
            for size in [4 * MIB, 4 * MIB, MIB, MIB] {
                alloc(&mut ev, size, opt());
            }
        }
        for a in g {
            free(&mut ev, a, zero());
        }
    }
    serde_json::to_vec(&ev).unwrap()
}

struct Run {
    dir: tempfile::TempDir,
}

impl Run {
    fn new() -> Run {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("trace.json"), trace()).unwrap();
        std::fs::write(dir.path().join("train.py"), TRAIN_PY).unwrap();
        Run { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn doctor(&self, trace: &Path, extra: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(["memory", "doctor"])
            .arg(trace)
            .arg("--source-root")
            .arg(self.dir.path())
            .args(extra)
            .output()
            .unwrap()
    }
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// gpt2 (124,439,808 parameters, Hugging Face's count) on an A100-80GB, micro-batch 8 of 512
/// tokens in bf16-mixed.
fn side_json() -> Value {
    json!({"model": "gpt2", "gpu": "A100-80GB", "seq_len": 512, "micro_batch": 8,
           "precision": "bf16-mixed", "optimizer": "adamw"})
}

#[test]
fn the_side_json_ranks_the_levers_and_says_what_does_not_match_the_trace() {
    let run = Run::new();
    let side = run.write("run.json", side_json().to_string().as_bytes());
    let out = run.doctor(&run.path("trace.json"), &["--side", side.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("Levers for gpt2 on A100-80GB"), "{stdout}");
    // The guide's order, cheapest first.
    let names = [
        "smaller micro-batch, more accumulation",
        "activation checkpointing",
        "lower precision",
        "8-bit optimizer states",
        "ZeRO/FSDP sharding",
        "offload",
    ];
    let at: Vec<usize> = names
        .iter()
        .map(|n| {
            stdout
                .find(&format!(". {n}"))
                .unwrap_or_else(|| panic!("{n}: {stdout}"))
        })
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{stdout}");
    assert!(
        stdout.contains("--micro-batch 4 --accumulation 2"),
        "{stdout}"
    );
    // gpt2 fits an A100-80GB as stated: every lever that applies fits, and the first is the
    // micro-batch.
    assert!(stdout.contains("and fits"), "{stdout}");
    assert!(stdout.contains("<- first that fits"), "{stdout}");
    let first = stdout
        .lines()
        .find(|l| l.contains("<- first that fits"))
        .unwrap();
    assert!(first.contains("smaller micro-batch"), "{first}");
    // The trace's parameters (5 MiB) are not gpt2's 124 M: said.
    assert!(
        stdout.contains("the trace holds 5.00 MiB of parameters at its peak")
            && stdout.contains("124439808 parameters"),
        "{stdout}"
    );
    // The side JSON's device is the replays' capacity: 80 GB of memory.
    assert!(
        stdout.contains("no out-of-memory at this capacity"),
        "{stdout}"
    );

    let out = run.doctor(
        &run.path("trace.json"),
        &["--side", side.to_str().unwrap(), "--json"],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let levers = &v["run"]["levers"];
    assert_eq!(levers["levers"].as_array().unwrap().len(), 6);
    assert_eq!(levers["first_fit"], 0);
    assert_eq!(levers["levers"][0]["lever"], "micro_batch");
    assert_eq!(v["run"]["parameters"], 124_439_808);
    assert_eq!(v["leaks"]["findings"][0]["mistake"], "loss_kept_with_graph");
}

#[test]
fn a_capacity_flag_that_differs_from_the_side_json_is_said() {
    let run = Run::new();
    let side = run.write("run.json", side_json().to_string().as_bytes());
    let out = run.doctor(
        &run.path("trace.json"),
        &["--side", side.to_str().unwrap(), "--capacity", "24GiB"],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("--capacity 24.00 GiB differs from the side JSON's device"),
        "{stdout}"
    );
}

#[test]
fn a_wrong_side_json_is_refused_naming_the_key() {
    let run = Run::new();
    let mut cases: Vec<(Value, &str)> = Vec::new();
    let with = |k: &str, v: Value| {
        let mut s = side_json();
        s[k] = v;
        s
    };
    cases.push((
        with("optimiser", json!("adamw")),
        "unknown field `optimiser`",
    ));
    cases.push((with("model", json!("no-such-model")), "no-such-model"));
    cases.push((with("precision", json!("fp8")), "fp8"));
    cases.push((with("seq_len", json!(0)), "\"seq_len\" is 0"));
    cases.push((
        with("zero", json!(4)),
        "\"zero\" is 4; accepted: 0, 1, 2, 3",
    ));
    cases.push((with("gpu", json!("B300")), "B300"));
    let mut no_device = side_json();
    no_device.as_object_mut().unwrap().remove("gpu");
    cases.push((no_device, "names no device"));
    cases.push((
        with("offload_optimizer", json!("cpu")),
        "--offload-optimizer needs --zero 1, 2 or 3",
    ));
    for (side, expected) in cases {
        let path = run.write("bad.json", side.to_string().as_bytes());
        let out = run.doctor(&run.path("trace.json"), &["--side", path.to_str().unwrap()]);
        let (stdout, stderr) = text(&out);
        assert!(!out.status.success(), "{side}: {stdout}");
        assert!(
            stderr.contains("--side") && stderr.contains(expected),
            "{side}: {stderr}"
        );
        assert!(stdout.is_empty(), "{stdout}");
    }
    let path = run.write("bad.json", b"{\"model\": \"gpt2\", ");
    let out = run.doctor(&run.path("trace.json"), &["--side", path.to_str().unwrap()]);
    assert!(text(&out).1.contains("not a side JSON"), "{}", text(&out).1);
}

#[test]
fn the_html_page_holds_the_findings_and_is_written_whole() {
    let run = Run::new();
    let side = run.write("run.json", side_json().to_string().as_bytes());
    let html = run.path("report.html");
    let out = run.doctor(
        &run.path("trace.json"),
        &[
            "--side",
            side.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out).1);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.trim_end().ends_with("</html>"));
    for expected in [
        "a loss (or metric) kept as a tensor with its graph",
        "train.py:21 (main)",
        "total_loss += loss",
        "fix: ",
        "loss.item()",
        "<svg",
        "<polygon",
        "Levers for this run",
        "smaller micro-batch, more accumulation",
        "first that fits",
        "no out-of-memory at this capacity",
    ] {
        assert!(page.contains(expected), "{expected} not in the page");
    }
    // Self-contained: nothing fetched, no script.
    assert!(!page.contains("<script") && !page.contains("src=") && !page.contains("<link"));
    // An unwritable --html is refused before any work, and nothing else is written.
    let out = run.doctor(
        &run.path("trace.json"),
        &["--html", run.path("no-such-dir/r.html").to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(text(&out).1.contains("--html"), "{}", text(&out).1);
}

fn pickle(v: &serde_pickle::Value) -> Vec<u8> {
    serde_pickle::value_to_vec(v, serde_pickle::SerOptions::new()).unwrap()
}

fn s(t: &str) -> serde_pickle::Value {
    serde_pickle::Value::String(t.into())
}

fn dict(pairs: Vec<(&str, serde_pickle::Value)>) -> serde_pickle::Value {
    serde_pickle::Value::Dict(
        pairs
            .into_iter()
            .map(|(k, v)| (serde_pickle::HashableValue::String(k.into()), v))
            .collect(),
    )
}

/// A snapshot as torch.cuda.memory._dump_snapshot writes it, recorded without stacks: three
/// steps of alloc/free entries with no `frames`.
fn snapshot_without_frames() -> Vec<u8> {
    use serde_pickle::Value::{I64, List};
    let mut entries = Vec::new();
    let mut addr = 0i64;
    entries.push(dict(vec![
        ("action", s("alloc")),
        ("addr", I64(1)),
        ("size", I64(1 << 20)),
    ]));
    for _ in 0..3 {
        addr += 4096;
        entries.push(dict(vec![
            ("action", s("alloc")),
            ("addr", I64(addr)),
            ("size", I64(512)),
        ]));
        entries.push(dict(vec![
            ("action", s("free_completed")),
            ("addr", I64(addr)),
            ("size", I64(512)),
        ]));
    }
    pickle(&dict(vec![
        ("segments", List(vec![])),
        ("device_traces", List(vec![List(entries)])),
    ]))
}

#[test]
fn bad_pickles_get_a_clear_error_and_a_snapshot_without_frames_says_what_it_cannot_attribute() {
    let run = Run::new();
    let good = snapshot_without_frames();
    // Truncated: the pickle ends before its STOP opcode.
    let cut = run.write("cut.pickle", &good[..good.len() / 2]);
    let out = run.doctor(&cut, &[]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cut.pickle is not a trace the doctor can read")
            && stderr.contains("is the file truncated?"),
        "{stderr}"
    );
    // Foreign: a pickle of a list, not a snapshot's dict.
    let list = pickle(&serde_pickle::Value::List(vec![serde_pickle::Value::I64(
        1,
    )]));
    let out = run.doctor(&run.write("list.pickle", &list), &[]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("the top level is not a dict"), "{stderr}");
    // Foreign: a dict with no device_traces (a state_dict, say).
    let other = pickle(&dict(vec![("weight", serde_pickle::Value::I64(3))]));
    let out = run.doctor(&run.write("state.pickle", &other), &[]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no allocation events in device_traces"),
        "{stderr}"
    );
    // Without frames: a diagnosis, and it says what it could not attribute.
    let out = run.doctor(&run.write("noframes.pickle", &good), &[]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("Not attributed:"), "{stdout}");
    assert!(
        stdout.contains("the trace has no Python frames"),
        "{stdout}"
    );
    assert!(stdout.contains("no phase could be read"), "{stdout}");
    // The 1 MiB block alive at the end is the peak: 1 MiB + 512 bytes.
    assert!(stdout.contains("Peak: 1.00 MiB allocated"), "{stdout}");
}
