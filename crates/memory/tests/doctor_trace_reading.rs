//! Reading traces: a PyTorch snapshot pickle with its frames, the tracer's JSON with phase
//! marks, and bad traces refused with the event they name.

use crate::doctor_support::{MIB, options};
use headroom_memory::doctor::{diagnose, read_trace};

#[test]
fn bad_traces_name_the_event() {
    for (text, needle) in [
        (
            r#"[{"action":"alloc","addr":1}]"#,
            "event 0: an alloc needs \"size\"",
        ),
        (r#"[{"action":"grow","addr":1}]"#, "unknown action"),
        (
            r#"[{"action":"alloc","addr":1,"size":8,"category":"weights"}]"#,
            "unknown memory category",
        ),
        (r#"[{"action":"alloc","addr":1,"size":8}"#, "ends early"),
    ] {
        let e = read_trace(text.as_bytes()).unwrap_err().to_string();
        assert!(e.contains(needle), "{text}: {e}");
    }
}

#[test]
fn a_pytorch_snapshot_pickle_is_read_with_its_frames() {
    use serde_pickle::{HashableValue as K, Value as V};
    use std::collections::BTreeMap;
    let frame = |file: &str, line: i64, name: &str| {
        let mut f = BTreeMap::new();
        f.insert(K::String("filename".into()), V::String(file.into()));
        f.insert(K::String("line".into()), V::I64(line));
        f.insert(K::String("name".into()), V::String(name.into()));
        V::Dict(f)
    };
    let entry = |action: &str, addr: i64, size: i64, frames: Vec<V>| {
        let mut e = BTreeMap::new();
        e.insert(K::String("action".into()), V::String(action.into()));
        e.insert(K::String("addr".into()), V::I64(addr));
        e.insert(K::String("size".into()), V::I64(size));
        e.insert(K::String("frames".into()), V::List(frames));
        V::Dict(e)
    };
    let at20 = || {
        vec![
            frame(
                "/x/site-packages/torch/nn/modules/linear.py",
                125,
                "forward",
            ),
            frame("train.py", 20, "main"),
        ]
    };
    let trace = vec![
        entry("segment_alloc", 100, 2 * MIB as i64, vec![]),
        entry("alloc", 100, 1024, at20()),
        entry("alloc", 200, 512, at20()),
        // PyTorch records a free twice: requested, then completed.
        entry("free_requested", 100, 1024, at20()),
        entry("free_completed", 100, 1024, at20()),
    ];
    let mut top = BTreeMap::new();
    top.insert(K::String("segments".into()), V::List(vec![]));
    top.insert(
        K::String("device_traces".into()),
        V::List(vec![V::List(trace)]),
    );
    let bytes = serde_pickle::value_to_vec(&V::Dict(top), serde_pickle::SerOptions::new()).unwrap();
    let events = read_trace(&bytes).unwrap();
    // Two allocs and one free; the segment event and the free request change no tensor.
    assert_eq!(events.events.len(), 3);
    // Both allocs share one interned stack of two frames.
    assert_eq!(events.events[0].stack, events.events[1].stack);
    let frames: Vec<_> = events.stack(events.events[0].stack).collect();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[1].line, 20);
    let none = |_: &str, _: i64| None;
    let d = diagnose(&events, &options(None, &none));
    let peak = d.peak.unwrap();
    assert_eq!(peak.allocated_bytes, 1024 + 512);
    assert_eq!(peak.sites[0].frame.as_ref().unwrap().line, 20);
    assert_eq!(peak.sites[0].count, 2);
}

#[test]
fn the_replay_reads_a_trace_with_phase_marks_and_frames() {
    // What `headroom.tracing` writes: frames on allocations and a zero_grad mark with no
    // address. The replay keeps the two allocations and the free; the mark changes no bytes.
    let text = r#"[
        {"action":"alloc","addr":1,"size":1024,"phase":"forward","step":0,"frames":[{"filename":"train.py","line":20,"name":"main"}]},
        {"action":"alloc","addr":2,"size":512,"phase":"backward","step":0},
        {"action":"mark","phase":"zero_grad","step":0},
        {"action":"free","addr":2,"phase":"zero_grad","step":0}
    ]"#;
    let trace = headroom_memory::replay::parse_trace(text.as_bytes()).unwrap();
    assert_eq!(trace.events.len(), 3);
}
