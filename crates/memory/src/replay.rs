//! Replaying allocation traces through the allocator: headroom's JSON trace (an array of
//! `{"action": "alloc" | "free", "addr": <id>, "size": <bytes>}`, optionally with `category` and
//! the labels of `replay_labels`: `phase`, `step`, `module`, `op`, `dtype`; read by
//! `replay_json`), or a PyTorch memory snapshot pickle whose `device_traces` are replayed (read by
//! `replay_snapshot`). A user can thereby ask "would expandable segments have saved my run?" of
//! their own trace.
//!
//! Not for: writing snapshots (see `snapshot`).

use crate::allocator::CachingAllocator;
use crate::category::Category;
use crate::replay_json::parse_json_trace;
use crate::replay_labels::{Label, Labels};
use crate::replay_snapshot::parse_pytorch_snapshot;
use std::collections::HashMap;

/// A trace that cannot be replayed; names the event and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error(
        "the trace is not valid JSON ({0}); is the file truncated? Expected an array of {{\"action\": \"alloc\"|\"free\", \"addr\": <id>, \"size\": <bytes>}}"
    )]
    Json(String),
    #[error("the trace must be a JSON array of events, found {0}")]
    NotAnArray(&'static str),
    #[error("event {index}: {reason}")]
    Event { index: usize, reason: String },
    #[error(
        "the PyTorch snapshot could not be read ({0}); is the file truncated? Write it with torch.cuda.memory._dump_snapshot(path)"
    )]
    Pickle(String),
    #[error(
        "the PyTorch snapshot has no allocation events in device_traces; record them with torch.cuda.memory._record_memory_history() before _dump_snapshot"
    )]
    NoEvents,
}

/// One replayable event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayEvent {
    Alloc {
        id: u64,
        size: u64,
        category: Category,
    },
    /// `lenient`: ignore if the id is not live (PyTorch rings may have dropped the alloc, and
    /// `free_completed` follows `free_requested`).
    Free { id: u64, lenient: bool },
}

/// Which format a trace came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    HeadroomJson,
    PytorchSnapshot,
}

/// A parsed trace.
#[derive(Debug, Clone)]
pub struct Trace {
    pub format: TraceFormat,
    pub events: Vec<ReplayEvent>,
    /// What each allocation was for (phase, module, op, …), where the trace says.
    pub labels: Labels,
}

/// Parses either format: a pickle starts with the PROTO opcode 0x80, anything else is JSON.
pub fn parse_trace(bytes: &[u8]) -> Result<Trace, TraceError> {
    if bytes.first() == Some(&0x80) {
        parse_pytorch_snapshot(bytes)
    } else {
        parse_json_trace(bytes)
    }
}

/// An allocation the replay could not serve.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReplayOom {
    pub event_index: usize,
    pub size: u64,
}

/// What happened during a replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReplayOutcome {
    pub allocs: u64,
    pub frees: u64,
    pub ooms: Vec<ReplayOom>,
    /// The index (in `Trace::events`) of the allocation that last raised the allocated peak.
    pub peak_event: Option<usize>,
}

/// Replays `trace` through `allocator`. An allocation that cannot be served is recorded as an OOM
/// (counted in `num_ooms`) and the replay continues; its later free is skipped.
pub fn replay(trace: &Trace, allocator: &mut CachingAllocator) -> ReplayOutcome {
    let mut outcome = ReplayOutcome::default();
    let mut addresses: HashMap<u64, u64> = HashMap::new();
    for (index, event) in trace.events.iter().enumerate() {
        match *event {
            ReplayEvent::Alloc { id, size, category } => {
                if let Some(label) = trace.labels.of(index) {
                    let history = allocator.trace_mut();
                    if let Some(phase) = &label.phase {
                        history.set_phase(phase);
                    }
                    if let Some(step) = label.step {
                        history.set_step(step);
                    }
                }
                let peak = allocator.stats().allocated_bytes.all.peak;
                let name = trace.labels.of(index).and_then(Label::site);
                match allocator.malloc(size, category, name.as_deref()) {
                    Ok(a) => {
                        if allocator.stats().allocated_bytes.all.peak > peak {
                            outcome.peak_event = Some(index);
                        }
                        // A PyTorch ring may show an id again whose free fell outside the ring.
                        if let Some(old) = addresses.insert(id, a.addr) {
                            let _ = allocator.free(old);
                        }
                        outcome.allocs += 1;
                    }
                    Err(_) => outcome.ooms.push(ReplayOom {
                        event_index: index,
                        size,
                    }),
                }
            }
            ReplayEvent::Free { id, .. } => {
                if let Some(addr) = addresses.remove(&id) {
                    allocator
                        .free(addr)
                        .expect("replay frees only addresses it allocated");
                    outcome.frees += 1;
                }
            }
        }
    }
    outcome
}

/// The window a whole trace is replayed in under the planned arena.
pub const TRACE_WINDOW: &str = "trace";

/// Replays `trace` through `allocator` with a planned arena: the trace is first recorded as one
/// window on an unlimited address-only allocator, its layout installed on `allocator`, and then
/// replayed in that window (allocations still live at the trace's end go to the caching pools).
pub fn replay_planned(
    trace: &Trace,
    allocator: &mut CachingAllocator,
) -> Result<ReplayOutcome, crate::ArenaError> {
    let mut recorder = CachingAllocator::new(
        u64::MAX / 4,
        allocator.config().clone(),
        Box::new(crate::VirtualSource::default()),
    );
    recorder.record_windows();
    recorder.begin_window(TRACE_WINDOW);
    replay(trace, &mut recorder);
    recorder.end_window();
    let plan = recorder.take_recorded_layout().unwrap_or_default();
    allocator.install_layout(plan)?;
    allocator.begin_window(TRACE_WINDOW);
    let outcome = replay(trace, allocator);
    allocator.end_window();
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name of a million bytes: "n" then "x" × 999,999.
    fn huge_name() -> String {
        format!("n{}", "x".repeat(999_999))
    }

    /// The message quotes the name's first 64 characters and its length, and stays short: the
    /// name itself (1,000,000 bytes), or as JSON with its quotes (1,000,002).
    fn assert_quoted(e: &str, as_json: bool) {
        let head = match as_json {
            false => format!("n{}… (1000000 bytes)", "x".repeat(63)),
            true => format!("\"n{}… (1000002 bytes)", "x".repeat(62)),
        };
        assert!(e.contains(&head), "{}", &e[..e.len().min(300)]);
        assert!(e.len() < 400, "a message of {} bytes", e.len());
    }

    #[test]
    fn a_huge_category_action_or_addr_in_a_json_trace_is_quoted_short() {
        let name = huge_name();
        for (event, needle, as_json) in [
            (
                format!(r#"{{"action":"alloc","addr":1,"size":8,"category":"{name}"}}"#),
                "unknown memory category",
                false,
            ),
            (
                format!(r#"{{"action":"{name}","addr":1}}"#),
                "unknown action",
                false,
            ),
            (
                format!(r#"{{"action":"alloc","addr":"{name}","size":8}}"#),
                "\"addr\" must be",
                true,
            ),
            (
                format!(r#"{{"action":"alloc","addr":1,"size":"{name}"}}"#),
                "\"size\" must be",
                true,
            ),
        ] {
            let e = parse_trace(format!("[{event}]").as_bytes())
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{}", &e[..e.len().min(300)]);
            assert_quoted(&e, as_json);
        }
    }

    #[test]
    fn a_huge_string_a_pickle_parser_quotes_is_cut_short() {
        // Protocol 2: BINUNICODE the huge name, BINUNICODE "a", APPEND: the stack top under
        // "a" is a string, not a list, and serde_pickle's error prints it.
        let name = huge_name();
        let mut bytes = vec![0x80, 2, b'X'];
        bytes.extend((name.len() as u32).to_le_bytes());
        bytes.extend(name.as_bytes());
        bytes.extend([b'X', 1, 0, 0, 0, b'a', b'a', b'.']);
        let e = parse_trace(&bytes).unwrap_err();
        assert!(matches!(e, TraceError::Pickle(_)), "{e}");
        let e = e.to_string();
        assert!(
            e.contains("invalid stack top") && e.contains(" bytes))"),
            "{e}"
        );
        assert!(e.len() < 500, "a message of {} bytes", e.len());
    }

    #[test]
    fn labels_are_read_and_the_peak_allocation_is_named() {
        // Live bytes: 1 MiB (forward), 3 MiB (+2 MiB backward), 2 MiB after the first free, then
        // +512 KiB in the optimizer (2.5 MiB): the peak is the backward allocation, event 1.
        let text = r#"[
            {"action":"alloc","addr":1,"size":1048576,"category":"activation","phase":"forward","step":0,"module":"h.0.mlp","op":"aten::mm","dtype":"float32"},
            {"action":"alloc","addr":2,"size":2097152,"category":"gradient","phase":"backward","step":0,"module":"h.0.mlp","op":"aten::mm"},
            {"action":"free","addr":1,"phase":"backward"},
            {"action":"alloc","addr":3,"size":524288,"category":"optimizer_state","phase":"optimizer","step":0}
        ]"#;
        let trace = parse_trace(text.as_bytes()).unwrap();
        assert_eq!(trace.labels.distinct(), 3);
        let first = trace.labels.of(0).unwrap();
        assert_eq!(first.module.as_deref(), Some("h.0.mlp"));
        assert_eq!(first.dtype.as_deref(), Some("float32"));
        assert_eq!(
            trace.labels.of(3).unwrap().phase.as_deref(),
            Some("optimizer")
        );
        let mut a = CachingAllocator::new(
            1 << 30,
            crate::AllocatorConfig::default(),
            Box::new(crate::VirtualSource::default()),
        );
        let outcome = replay(&trace, &mut a);
        assert_eq!(outcome.peak_event, Some(1));
        assert_eq!(
            trace.labels.of(1).unwrap().phase.as_deref(),
            Some("backward")
        );

        let e = parse_trace(br#"[{"action":"alloc","addr":1,"size":8,"phase":3}]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("event 0: \"phase\" must be a string"), "{e}");
        let e = parse_trace(br#"[{"action":"alloc","addr":1,"size":8,"step":-1}]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"step\" must be a non-negative integer"), "{e}");
    }
}
