//! Replaying allocation traces through the allocator: headroom's JSON trace (an array of
//! `{"action": "alloc" | "free", "addr": <id>, "size": <bytes>}`, optionally with `category` and
//! the labels of `replay_labels`: `phase`, `step`, `module`, `op`, `dtype`),
//! or a PyTorch memory snapshot pickle whose `device_traces` are replayed (read by
//! `replay_snapshot`). A user can thereby ask "would expandable segments have saved my run?" of
//! their own trace.
//!
//! Not for: writing snapshots (see `snapshot`).

use crate::allocator::CachingAllocator;
use crate::category::Category;
use crate::quote::quote;
use crate::replay_labels::{Label, Labels, read_label};
use crate::replay_snapshot::{library_message, parse_json_snapshot, parse_pytorch_snapshot};
use crate::rounding::MAX_REQUEST;
use std::collections::HashMap;
use std::sync::Arc;

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

/// Parses a JSON trace as it is read, one event at a time: a trace of 10^7 events never
/// exists as a JSON tree in memory (only the replayable events do, 24 bytes each).
fn parse_json_trace(bytes: &[u8]) -> Result<Trace, TraceError> {
    use serde::Deserializer as _;
    let mut reader = EventReader::default();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let outcome = de
        .deserialize_any(TraceVisitor {
            reader: &mut reader,
        })
        .and_then(|top| de.end().map(|()| top));
    match outcome {
        Ok(Top::Events) => Ok(Trace {
            format: TraceFormat::HeadroomJson,
            events: reader.events,
            labels: reader.labels,
        }),
        Ok(Top::Snapshot(value)) => parse_json_snapshot(&value),
        Ok(Top::Object) => Err(TraceError::NotAnArray("an object")),
        Ok(Top::Scalar) => Err(TraceError::NotAnArray("a scalar")),
        Err(e) => Err(reader
            .failure
            .take()
            .unwrap_or_else(|| TraceError::Json(library_message(&e)))),
    }
}

/// What the top level of a JSON trace turned out to be.
enum Top {
    Events,
    /// A snapshot written as JSON (`Snapshot::write_json`): replay its first device trace.
    Snapshot(serde_json::Value),
    Object,
    Scalar,
}

/// Checks and collects events one by one.
#[derive(Default)]
struct EventReader {
    events: Vec<ReplayEvent>,
    /// Live ids and the index of the event that allocated each.
    live: HashMap<u64, usize>,
    /// The event error that stopped the parse.
    failure: Option<TraceError>,
    labels: Labels,
    /// Label strings seen so far, shared between labels.
    texts: HashMap<String, Arc<str>>,
}

impl EventReader {
    fn accept(&mut self, index: usize, event: &serde_json::Value) -> Result<(), TraceError> {
        let err = |reason: String| TraceError::Event { index, reason };
        let obj = event
            .as_object()
            .ok_or_else(|| err("an event must be an object".into()))?;
        let action = obj
            .get("action")
            .and_then(|a| a.as_str())
            .ok_or_else(|| err("missing \"action\" (alloc or free)".into()))?;
        // A phase mark (the doctor's `{"action": "mark", "phase": ...}`) changes no bytes.
        if action == "mark" {
            return Ok(());
        }
        let id = match obj.get("addr") {
            Some(v) => v.as_u64().ok_or_else(|| {
                err(format!(
                    "\"addr\" must be a non-negative integer id, got {}",
                    quote(&v.to_string())
                ))
            })?,
            None => return Err(err("missing \"addr\"".into())),
        };
        let size = match obj.get("size") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => {
                if v.as_i64().is_some_and(|s| s < 0) {
                    return Err(err(format!("negative size {v}")));
                }
                let s = v.as_u64().ok_or_else(|| {
                    err(format!(
                        "\"size\" must be an integer number of bytes, got {}",
                        quote(&v.to_string())
                    ))
                })?;
                if s >= MAX_REQUEST {
                    return Err(err(format!("absurd size {s} bytes (1 EiB or more)")));
                }
                Some(s)
            }
        };
        match action {
            "alloc" => {
                let size = size.ok_or_else(|| err("alloc needs \"size\"".into()))?;
                let category = match obj.get("category").and_then(|c| c.as_str()) {
                    Some(c) => c
                        .parse()
                        .map_err(|e: crate::category::UnknownCategory| err(e.to_string()))?,
                    None => Category::Other,
                };
                if let Some(prev) = self.live.insert(id, index) {
                    return Err(err(format!(
                        "alloc of id {id}, which is still live since event {prev}"
                    )));
                }
                let label = read_label(obj, &mut self.texts).map_err(err)?;
                self.labels.push(self.events.len(), label);
                self.events.push(ReplayEvent::Alloc { id, size, category });
            }
            "free" | "free_requested" => {
                if self.live.remove(&id).is_none() {
                    return Err(err(format!(
                        "free of unknown id {id} (never allocated, or already freed)"
                    )));
                }
                self.events.push(ReplayEvent::Free { id, lenient: false });
            }
            // The rest are the allocator's own decisions or duplicates: nothing to replay.
            "free_completed" | "segment_alloc" | "segment_free" | "segment_map"
            | "segment_unmap" | "oom" | "snapshot" => {}
            other => {
                return Err(err(format!(
                    "unknown action \"{}\"; expected alloc or free (or a PyTorch trace action)",
                    quote(other)
                )));
            }
        }
        Ok(())
    }
}

struct TraceVisitor<'r> {
    reader: &'r mut EventReader,
}

impl<'de> serde::de::Visitor<'de> for TraceVisitor<'_> {
    type Value = Top;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of allocation events")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Top, A::Error> {
        let mut index = 0;
        while let Some(event) = seq.next_element::<serde_json::Value>()? {
            if let Err(e) = self.reader.accept(index, &event) {
                self.reader.failure = Some(e);
                return Err(serde::de::Error::custom("bad event"));
            }
            index += 1;
        }
        Ok(Top::Events)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Top, A::Error> {
        use serde::Deserialize;
        let value =
            serde_json::Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        Ok(if value.get("device_traces").is_some() {
            Top::Snapshot(value)
        } else {
            Top::Object
        })
    }

    fn visit_bool<E>(self, _: bool) -> Result<Top, E> {
        Ok(Top::Scalar)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Top, E> {
        Ok(Top::Scalar)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Top, E> {
        Ok(Top::Scalar)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Top, E> {
        Ok(Top::Scalar)
    }
    fn visit_str<E>(self, _: &str) -> Result<Top, E> {
        Ok(Top::Scalar)
    }
    fn visit_unit<E>(self) -> Result<Top, E> {
        Ok(Top::Scalar)
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

    #[test]
    fn bad_json_traces_name_the_event() {
        let cases = [
            (
                r#"[{"action":"alloc","addr":1,"size":10},{"action":"grow","addr":1}]"#,
                "event 1: unknown action",
            ),
            (
                r#"[{"action":"free","addr":7}]"#,
                "event 0: free of unknown id 7",
            ),
            (
                r#"[{"action":"alloc","addr":1,"size":-4}]"#,
                "event 0: negative size",
            ),
            (
                r#"[{"action":"alloc","addr":1,"size":2000000000000000000}]"#,
                "event 0: absurd size",
            ),
            (
                r#"[{"action":"alloc","addr":1,"size":10},{"action":"alloc","addr":1,"size":10}]"#,
                "still live",
            ),
            (r#"[{"action":"alloc","addr":1,"size":10},"#, "truncated"),
            (r#"{"action":"alloc"}"#, "JSON array"),
        ];
        for (text, needle) in cases {
            let e = parse_trace(text.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

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
    fn a_pickle_nested_100000_deep_is_refused_without_recursion() {
        // 100,000 empty lists appended into each other: `]` × 100,000 then `a` × 99,999.
        let mut bytes = vec![0x80, 2];
        bytes.extend(std::iter::repeat_n(b']', 100_000));
        bytes.extend(std::iter::repeat_n(b'a', 99_999));
        bytes.push(b'.');
        let e = parse_trace(&bytes).unwrap_err().to_string();
        assert!(e.contains("100000 levels deep"), "{e}");
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

    #[test]
    fn truncated_pickle_is_a_clear_error() {
        let e = parse_trace(&[0x80, 0x03, b'}']).unwrap_err();
        assert!(matches!(e, TraceError::Pickle(_)), "{e}");
    }
}
