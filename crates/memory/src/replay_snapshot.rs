//! Reading a PyTorch memory snapshot for replay: the pickle `torch.cuda.memory._dump_snapshot`
//! writes (its nesting checked before it is converted, its first device's `device_traces`
//! replayed: `alloc`, `free_requested`/`free_completed`; an allocation's `user_metadata` with
//! label fields labels it, as `headroom.record`'s phases do) and the same dict as JSON, read
//! the same way. The
//! pickle helpers are shared with the doctor's reader.
//!
//! Not for: headroom's JSON trace (see `replay_json`) or the replay itself (see `replay`).

use crate::category::Category;
use crate::quote::quote_at_most;
use crate::replay::{ReplayEvent, Trace, TraceError, TraceFormat};
use crate::replay_labels::{Labels, metadata_label};
use crate::rounding::MAX_REQUEST;
use serde_pickle::{HashableValue, Value};
use std::collections::HashMap;

pub(crate) fn parse_json_snapshot(value: &serde_json::Value) -> Result<Trace, TraceError> {
    let entries = value["device_traces"]
        .as_array()
        .and_then(|devices| {
            devices
                .iter()
                .filter_map(|d| d.as_array())
                .find(|d| !d.is_empty())
        })
        .ok_or(TraceError::NoEvents)?;
    let mut events = Vec::with_capacity(entries.len());
    let mut labels = Labels::default();
    let mut text = HashMap::new();
    for (index, e) in entries.iter().enumerate() {
        let err = |reason: String| TraceError::Event { index, reason };
        let action = e["action"]
            .as_str()
            .ok_or_else(|| err("missing action".into()))?;
        let addr = e["addr"].as_u64();
        match action {
            "alloc" => {
                let id = addr.ok_or_else(|| err("alloc without addr".into()))?;
                let size = e["size"]
                    .as_u64()
                    .ok_or_else(|| err("alloc without a valid size".into()))?;
                if size >= MAX_REQUEST {
                    return Err(err(format!("absurd size {size} bytes")));
                }
                let category = e["frames"][0]["name"]
                    .as_str()
                    .and_then(|n| n.split([':', ' ']).next())
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(Category::Other);
                if let Some(label) = e["user_metadata"]
                    .as_str()
                    .and_then(|m| metadata_label(m, &mut text))
                {
                    labels.push(events.len(), label);
                }
                events.push(ReplayEvent::Alloc { id, size, category });
            }
            "free_requested" | "free_completed" => {
                let id = addr.ok_or_else(|| err(format!("{action} without addr")))?;
                events.push(ReplayEvent::Free { id, lenient: true });
            }
            _ => {}
        }
    }
    if events.is_empty() {
        return Err(TraceError::NoEvents);
    }
    Ok(Trace {
        format: TraceFormat::PytorchSnapshot,
        events,
        labels,
    })
}

/// A parser's error message, which may quote the input (serde_pickle prints the value it found
/// where another was expected): at most [`LIBRARY_MESSAGE_CHARS`] characters of it.
pub(crate) fn library_message(e: &dyn std::fmt::Display) -> String {
    quote_at_most(&e.to_string(), LIBRARY_MESSAGE_CHARS).into_owned()
}

/// Room for a parser's own words and the start of the value it quotes.
const LIBRARY_MESSAGE_CHARS: usize = 160;

pub(crate) fn key(name: &str) -> HashableValue {
    HashableValue::String(name.to_string())
}

pub(crate) fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::I64(i) if *i >= 0 => Some(*i as u64),
        Value::Int(big) => u64::try_from(big).ok(),
        _ => None,
    }
}

/// The deepest nesting a snapshot may have: PyTorch's nest a handful of levels; converting a
/// deeper value recursively could overflow the stack.
const MAX_PICKLE_DEPTH: usize = 1000;

/// A PyTorch snapshot pickle's top-level dict, its nesting checked before it is converted.
pub(crate) fn snapshot_dict(
    bytes: &[u8],
) -> Result<std::collections::BTreeMap<HashableValue, Value>, TraceError> {
    if let Some(depth) = crate::pickle_depth::nesting_depth(bytes)
        && depth > MAX_PICKLE_DEPTH
    {
        return Err(TraceError::Pickle(format!(
            "its value nests {depth} levels deep, more than the {MAX_PICKLE_DEPTH} accepted"
        )));
    }
    let options = serde_pickle::DeOptions::new().replace_unresolved_globals();
    let value = serde_pickle::value_from_slice(bytes, options)
        .map_err(|e| TraceError::Pickle(library_message(&e)))?;
    match value {
        Value::Dict(dict) => Ok(dict),
        _ => Err(TraceError::Pickle("the top level is not a dict".into())),
    }
}

/// The trace entries of the first device that has any.
pub(crate) fn first_device_entries(
    dict: &std::collections::BTreeMap<HashableValue, Value>,
) -> Result<&Vec<Value>, TraceError> {
    let traces = match dict.get(&key("device_traces")) {
        Some(Value::List(devices)) => devices,
        _ => return Err(TraceError::NoEvents),
    };
    traces
        .iter()
        .filter_map(|d| match d {
            Value::List(entries) if !entries.is_empty() => Some(entries),
            _ => None,
        })
        .next()
        .ok_or(TraceError::NoEvents)
}

pub(crate) fn parse_pytorch_snapshot(bytes: &[u8]) -> Result<Trace, TraceError> {
    let dict = snapshot_dict(bytes)?;
    // Replay the first device that has events.
    let entries = first_device_entries(&dict)?;
    let mut events = Vec::with_capacity(entries.len());
    let mut labels = Labels::default();
    let mut text = HashMap::new();
    for (index, entry) in entries.iter().enumerate() {
        let err = |reason: String| TraceError::Event { index, reason };
        let Value::Dict(e) = entry else {
            return Err(err("a trace entry is not a dict".into()));
        };
        let action = match e.get(&key("action")) {
            Some(Value::String(a)) => a.as_str(),
            _ => return Err(err("missing action".into())),
        };
        let addr = e.get(&key("addr")).and_then(as_u64);
        match action {
            "alloc" => {
                let addr = addr.ok_or_else(|| err("alloc without addr".into()))?;
                let size = e
                    .get(&key("size"))
                    .and_then(as_u64)
                    .ok_or_else(|| err("alloc without a valid size".into()))?;
                if size >= MAX_REQUEST {
                    return Err(err(format!("absurd size {size} bytes")));
                }
                if let Some(Value::String(metadata)) = e.get(&key("user_metadata"))
                    && let Some(label) = metadata_label(metadata, &mut text)
                {
                    labels.push(events.len(), label);
                }
                events.push(ReplayEvent::Alloc {
                    id: addr,
                    size,
                    category: Category::Other,
                });
            }
            "free_requested" | "free_completed" => {
                let addr = addr.ok_or_else(|| err(format!("{action} without addr")))?;
                events.push(ReplayEvent::Free {
                    id: addr,
                    lenient: true,
                });
            }
            _ => {}
        }
    }
    if events.is_empty() {
        return Err(TraceError::NoEvents);
    }
    Ok(Trace {
        format: TraceFormat::PytorchSnapshot,
        events,
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::CachingAllocator;
    use crate::replay::{parse_trace, replay};

    #[test]
    fn a_snapshots_user_metadata_labels_its_allocations() {
        // What `headroom.record` leaves: a user's own metadata that is not a label (ignored, not
        // an error), the recording thread's allocations tagged with their phase and step, and
        // autograd's threads' untagged. Live: 512 B, then +1, +2 and +4 MiB: the optimizer's
        // allocation (event 3) sets the peak.
        let entry = |addr: i64, size: i64, meta: Option<&str>| {
            let mut d = std::collections::BTreeMap::new();
            d.insert(key("action"), Value::String("alloc".into()));
            d.insert(key("addr"), Value::I64(addr));
            d.insert(key("size"), Value::I64(size));
            if let Some(m) = meta {
                d.insert(key("user_metadata"), Value::String(m.into()));
            }
            Value::Dict(d)
        };
        let entries = vec![
            entry(4, 512, Some("my run, attempt 2")),
            entry(1, 1 << 20, Some(r#"{"phase":"forward","step":3}"#)),
            entry(2, 2 << 20, None),
            entry(3, 4 << 20, Some(r#"{"phase":"optimizer","step":3}"#)),
        ];
        let mut top = std::collections::BTreeMap::new();
        top.insert(
            key("device_traces"),
            Value::List(vec![Value::List(entries)]),
        );
        let bytes =
            serde_pickle::value_to_vec(&Value::Dict(top), serde_pickle::SerOptions::new()).unwrap();
        let trace = parse_trace(&bytes).unwrap();
        assert_eq!(trace.format, TraceFormat::PytorchSnapshot);
        let forward = trace.labels.of(1).unwrap();
        assert_eq!(
            (forward.phase.as_deref(), forward.step),
            (Some("forward"), Some(3))
        );
        assert!(trace.labels.of(0).is_none() && trace.labels.of(2).is_none());
        let mut a = CachingAllocator::new(
            1 << 30,
            crate::AllocatorConfig::default(),
            Box::new(crate::VirtualSource::default()),
        );
        let outcome = replay(&trace, &mut a);
        assert_eq!(outcome.peak_event, Some(3));
        assert_eq!(
            trace.labels.of(3).unwrap().phase.as_deref(),
            Some("optimizer")
        );
    }

    #[test]
    fn the_json_form_of_a_snapshot_reads_the_same_labels() {
        let text = br#"{"device_traces": [[
            {"action": "alloc", "addr": 1, "size": 1024, "user_metadata": "{\"phase\": \"backward\", \"step\": 2}"},
            {"action": "alloc", "addr": 2, "size": 512, "user_metadata": "not a label"}
        ]]}"#;
        let trace = parse_trace(text).unwrap();
        let label = trace.labels.of(0).unwrap();
        assert_eq!(
            (label.phase.as_deref(), label.step),
            (Some("backward"), Some(2))
        );
        assert!(trace.labels.of(1).is_none());
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
    fn truncated_pickle_is_a_clear_error() {
        let e = parse_trace(&[0x80, 0x03, b'}']).unwrap_err();
        assert!(matches!(e, TraceError::Pickle(_)), "{e}");
    }
}
