//! Reading a trace for the doctor, with its Python stacks: a PyTorch snapshot pickle
//! (`torch.cuda.memory._dump_snapshot`: `device_traces` entries with `frames`; `annotate` entries
//! as phase marks; a `user_metadata` JSON object's `phase` and `step`, as `headroom.record` tags
//! them) or headroom's JSON trace (an array of events, each optionally with `frames`,
//! `category`, `phase` and `step`; `{"action": "mark", "phase": ...}` marks a phase that
//! allocates nothing). Frames headroom's own snapshots write (`headroom`, `category:name [step N
//! phase]`) give back their category, step and phase. Frames and stacks are interned as read.
//!
//! Not for: the replay-only reader (see `crate::replay`), which keeps no stacks.

use super::events::{Action, Event, Events, Frame, Phase};
use crate::category::Category;
use crate::quote::quote;
use crate::replay::TraceError;
use crate::replay_labels::metadata_label;
use crate::replay_snapshot::{as_u64, first_device_entries, key, snapshot_dict};
use crate::rounding::MAX_REQUEST;
use serde::Deserialize;
use serde_pickle::Value;

/// A trace the doctor cannot read.
pub type DoctorReadError = TraceError;

/// Reads either format: a pickle starts with the PROTO opcode 0x80, anything else is JSON.
pub fn read_trace(bytes: &[u8]) -> Result<Events, DoctorReadError> {
    if bytes.first() == Some(&0x80) {
        read_snapshot(bytes)
    } else {
        read_json(bytes)
    }
}

#[derive(Deserialize)]
struct RawFrame {
    filename: String,
    line: i64,
    name: String,
}

#[derive(Deserialize)]
struct RawEvent {
    action: String,
    addr: Option<u64>,
    size: Option<u64>,
    category: Option<String>,
    phase: Option<String>,
    step: Option<u32>,
    #[serde(default)]
    frames: Vec<RawFrame>,
}

/// What headroom's own snapshot frames carry: `category[:name] [step N phase]`.
fn headroom_tag(f: &Frame) -> Option<(Option<Category>, Option<u32>, Option<Phase>)> {
    if f.filename != "headroom" {
        return None;
    }
    let (label, rest) = f.name.split_once(" [step ")?;
    let category = label.split(':').next().and_then(|c| c.parse().ok());
    let rest = rest.strip_suffix(']')?;
    let (step, phase) = match rest.split_once(' ') {
        Some((s, p)) => (s.parse().ok(), Phase::parse(p)),
        None => (rest.parse().ok(), None),
    };
    Some((category, step, phase))
}

struct Builder {
    events: Events,
}

/// One entry as read, before it is checked.
struct Entry<'a> {
    action: &'a str,
    addr: Option<u64>,
    size: Option<u64>,
    frames: Vec<Frame>,
    category: Option<Category>,
    phase: Option<Phase>,
    step: Option<u32>,
}

impl Builder {
    fn push(&mut self, index: usize, entry: Entry<'_>) -> Result<(), TraceError> {
        let Entry {
            action,
            addr,
            size,
            frames,
            mut category,
            mut phase,
            mut step,
        } = entry;
        let err = |reason: String| TraceError::Event { index, reason };
        if let Some((c, s, p)) = frames.first().and_then(headroom_tag) {
            category = category.or(c);
            step = step.or(s);
            phase = phase.or(p);
        }
        let action = match action {
            "alloc" => Action::Alloc,
            "free" | "free_completed" => Action::Free,
            // PyTorch writes free_requested, then free_completed when the stream is done.
            "free_requested" => return Ok(()),
            "mark" | "annotate" => Action::Mark,
            // Segment events, snapshots and OOM records change no tensor's bytes.
            "segment_alloc" | "segment_free" | "segment_map" | "segment_unmap" | "snapshot"
            | "oom" => return Ok(()),
            other => {
                return Err(err(format!(
                    "unknown action {}; expected alloc, free, mark",
                    quote(other)
                )));
            }
        };
        let addr = match action {
            Action::Mark => addr.unwrap_or(0),
            _ => addr.ok_or_else(|| err("missing \"addr\"".into()))?,
        };
        let size = match action {
            Action::Alloc => {
                let s = size.ok_or_else(|| err("an alloc needs \"size\"".into()))?;
                if s >= MAX_REQUEST {
                    return Err(err(format!("absurd size {s} bytes")));
                }
                s
            }
            _ => size.unwrap_or(0),
        };
        if action == Action::Mark && phase.is_none() {
            return Ok(());
        }
        let ids = frames
            .into_iter()
            .map(|f| self.events.intern_frame(f))
            .collect();
        let stack = self.events.intern_stack(ids);
        self.events.push(Event {
            action,
            addr,
            size,
            stack,
            category,
            phase,
            step,
        });
        Ok(())
    }
}

fn read_json(bytes: &[u8]) -> Result<Events, TraceError> {
    use serde::de::{Deserializer as _, SeqAccess, Visitor};
    struct Seq<'a> {
        builder: &'a mut Builder,
        failure: &'a mut Option<TraceError>,
    }
    impl<'de> Visitor<'de> for Seq<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of events")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut index = 0;
            while let Some(raw) = seq.next_element::<RawEvent>().inspect_err(|e| {
                *self.failure = Some(TraceError::Event {
                    index,
                    reason: e.to_string(),
                });
            })? {
                let category = match raw.category.as_deref().map(str::parse::<Category>) {
                    Some(Ok(c)) => Some(c),
                    Some(Err(e)) => {
                        *self.failure = Some(TraceError::Event {
                            index,
                            reason: e.to_string(),
                        });
                        return Err(serde::de::Error::custom("bad category"));
                    }
                    None => None,
                };
                let frames = raw
                    .frames
                    .into_iter()
                    .map(|f| Frame {
                        filename: f.filename,
                        line: f.line,
                        name: f.name,
                    })
                    .collect();
                let phase = raw.phase.as_deref().and_then(Phase::parse);
                let entry = Entry {
                    action: &raw.action,
                    addr: raw.addr,
                    size: raw.size,
                    frames,
                    category,
                    phase,
                    step: raw.step,
                };
                if let Err(e) = self.builder.push(index, entry) {
                    *self.failure = Some(e);
                    return Err(serde::de::Error::custom("bad event"));
                }
                index += 1;
            }
            Ok(())
        }
    }
    let mut builder = Builder {
        events: Events::new(),
    };
    let mut failure = None;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let outcome = de
        .deserialize_seq(Seq {
            builder: &mut builder,
            failure: &mut failure,
        })
        .and_then(|()| de.end());
    match (outcome, failure) {
        (Ok(()), _) => Ok(builder.events),
        (Err(e), _) if e.is_eof() => Err(TraceError::Json(format!(
            "it ends early at line {}",
            e.line()
        ))),
        (Err(_), Some(f)) => Err(f),
        (Err(e), None) => Err(TraceError::Json(e.to_string())),
    }
}

fn string(v: Option<&Value>) -> Option<&str> {
    match v {
        Some(Value::String(s)) => Some(s.as_str()),
        _ => None,
    }
}

fn read_snapshot(bytes: &[u8]) -> Result<Events, TraceError> {
    let dict = snapshot_dict(bytes)?;
    let entries = first_device_entries(&dict)?;
    let mut builder = Builder {
        events: Events::new(),
    };
    builder.events.untagged_from_stacks = true;
    let mut text = std::collections::HashMap::new();
    for (index, entry) in entries.iter().enumerate() {
        let Value::Dict(e) = entry else {
            return Err(TraceError::Event {
                index,
                reason: "a trace entry is not a dict".into(),
            });
        };
        let action = string(e.get(&key("action"))).ok_or_else(|| TraceError::Event {
            index,
            reason: "missing action".into(),
        })?;
        let frames = match e.get(&key("frames")) {
            Some(Value::List(frames)) => frames
                .iter()
                .filter_map(|f| match f {
                    Value::Dict(f) => Some(Frame {
                        filename: string(f.get(&key("filename"))).unwrap_or("??").to_string(),
                        line: f.get(&key("line")).and_then(as_u64).unwrap_or(0) as i64,
                        name: string(f.get(&key("name"))).unwrap_or("??").to_string(),
                    }),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        // `annotate` entries (record_function ranges) name their phase in `stage` or `name`;
        // `headroom.record` tags what the recording thread allocates in `user_metadata`.
        let tagged =
            string(e.get(&key("user_metadata"))).and_then(|m| metadata_label(m, &mut text));
        let phase = string(e.get(&key("stage")))
            .or(string(e.get(&key("name"))))
            .and_then(Phase::parse)
            .or_else(|| tagged.as_ref()?.phase.as_deref().and_then(Phase::parse));
        let step = tagged
            .as_ref()
            .and_then(|t| t.step)
            .and_then(|s| u32::try_from(s).ok());
        let entry = Entry {
            action,
            addr: e.get(&key("addr")).and_then(as_u64),
            size: e.get(&key("size")).and_then(as_u64),
            frames,
            category: None,
            phase,
            step,
        };
        builder.push(index, entry)?;
    }
    Ok(builder.events)
}
