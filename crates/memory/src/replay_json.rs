//! Reading headroom's JSON trace for replay, one event at a time as it is parsed (each event
//! checked: its action, id, size, category and labels); a JSON snapshot found at the top level
//! is handed to `replay_snapshot`.
//!
//! Not for: PyTorch's pickle snapshots (see `replay_snapshot`) or the replay itself (see `replay`).

use crate::category::Category;
use crate::quote::quote;
use crate::replay::{ReplayEvent, Trace, TraceError, TraceFormat};
use crate::replay_labels::{Labels, read_label};
use crate::replay_snapshot::{library_message, parse_json_snapshot};
use crate::rounding::MAX_REQUEST;
use std::collections::HashMap;
use std::sync::Arc;

/// Parses a JSON trace as it is read, one event at a time: a trace of 10^7 events never
/// exists as a JSON tree in memory (only the replayable events do, 24 bytes each).
pub(crate) fn parse_json_trace(bytes: &[u8]) -> Result<Trace, TraceError> {
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

#[cfg(test)]
mod tests {
    use crate::replay::parse_trace;

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
}
