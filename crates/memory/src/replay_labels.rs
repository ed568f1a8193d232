//! What a traced allocation was for, beyond its category: the training phase (`forward`,
//! `backward`, `optimizer`, `zero_grad`), the step, the module path, the operator and the dtype
//! that a tracer (`headroom trace`) records with each `alloc` event. A replay names these for
//! the allocation that set the allocated peak, so a report can say "the peak is in backward, in
//! `model.layers.1.mlp`, at `aten::mm`".
//!
//! Not for: the bytes or the category (those are the replayable event itself, `ReplayEvent`).

use std::collections::HashMap;
use std::sync::Arc;

/// The optional labels of one allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Label {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<Arc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Arc<str>>,
}

impl Label {
    /// The JSON fields this type reads from an event.
    pub const FIELDS: [&'static str; 5] = ["phase", "step", "module", "op", "dtype"];

    fn is_empty(&self) -> bool {
        *self == Label::default()
    }

    /// Where the allocation was made, as a replay names it for the allocator (and so for a
    /// snapshot's frames, `activation:model.h.0.mlp aten::addmm [step 0 forward]`): the module
    /// and the op, whichever the trace has.
    pub fn site(&self) -> Option<String> {
        match (self.module.as_deref(), self.op.as_deref()) {
            (Some(m), Some(o)) if !m.is_empty() => Some(format!("{m} {o}")),
            (Some(m), _) if !m.is_empty() => Some(m.to_string()),
            (_, Some(o)) => Some(o.to_string()),
            _ => None,
        }
    }
}

/// The labels of a trace's events, interned: each distinct label is stored once and every event
/// holds a 4-byte index (a trace of 10^7 events with a few thousand distinct labels costs 40 MB,
/// not one string set per event).
#[derive(Debug, Clone, Default)]
pub struct Labels {
    table: Vec<Label>,
    index: HashMap<Label, u32>,
    /// One entry per event once any event is labelled; [`UNLABELLED`] for events without one.
    per_event: Vec<u32>,
}

const UNLABELLED: u32 = u32::MAX;

impl Labels {
    /// Records the label of event `event` (events are recorded in order; an empty label is
    /// "none").
    pub fn push(&mut self, event: usize, label: Label) {
        if label.is_empty() {
            return;
        }
        let next = self.table.len() as u32;
        let slot = *self.index.entry(label.clone()).or_insert_with(|| {
            self.table.push(label);
            next
        });
        if self.per_event.len() <= event {
            self.per_event.resize(event + 1, UNLABELLED);
        }
        self.per_event[event] = slot;
    }

    /// The label of event `event`, if it has one.
    pub fn of(&self, event: usize) -> Option<&Label> {
        let slot = *self.per_event.get(event)?;
        self.table.get(slot as usize)
    }

    /// Whether no event has a label.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Distinct labels.
    pub fn distinct(&self) -> usize {
        self.table.len()
    }
}

/// The label a PyTorch snapshot entry's `user_metadata` carries, where it is a JSON object with
/// label fields (`headroom.record`'s phases write `{"phase": ..., "step": ...}` through
/// `torch.cuda.memory._set_memory_metadata`). Metadata is the user's free-form string: anything
/// else, or a field of the wrong type, is no label rather than an error.
pub fn metadata_label(metadata: &str, text: &mut HashMap<String, Arc<str>>) -> Option<Label> {
    let value: serde_json::Value = serde_json::from_str(metadata).ok()?;
    let label = read_label(value.as_object()?, text).ok()?;
    (!label.is_empty()).then_some(label)
}

/// Reads the label fields of a JSON event; a field of the wrong type is an error naming it.
pub fn read_label(
    obj: &serde_json::Map<String, serde_json::Value>,
    text: &mut HashMap<String, Arc<str>>,
) -> Result<Label, String> {
    let mut string = |name: &str| -> Result<Option<Arc<str>>, String> {
        match obj.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(match text.get(s.as_str()) {
                Some(shared) => shared.clone(),
                None => {
                    let shared: Arc<str> = Arc::from(s.as_str());
                    text.insert(s.clone(), shared.clone());
                    shared
                }
            })),
            Some(other) => Err(format!(
                "\"{name}\" must be a string, got {}",
                crate::quote::quote(&other.to_string())
            )),
        }
    };
    let phase = string("phase")?;
    let module = string("module")?;
    let op = string("op")?;
    let dtype = string("dtype")?;
    let step = match obj.get("step") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            format!(
                "\"step\" must be a non-negative integer, got {}",
                crate::quote::quote(&v.to_string())
            )
        })?),
    };
    Ok(Label {
        phase,
        step,
        module,
        op,
        dtype,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(phase: &str) -> Label {
        Label {
            phase: Some(Arc::from(phase)),
            ..Label::default()
        }
    }

    #[test]
    fn equal_labels_are_stored_once_and_unlabelled_events_have_none() {
        let mut l = Labels::default();
        l.push(0, label("forward"));
        l.push(2, label("backward"));
        l.push(3, label("forward"));
        l.push(4, Label::default());
        assert_eq!(l.distinct(), 2);
        assert_eq!(l.of(0).unwrap().phase.as_deref(), Some("forward"));
        assert!(l.of(1).is_none());
        assert_eq!(l.of(2).unwrap().phase.as_deref(), Some("backward"));
        assert_eq!(l.of(3).unwrap().phase.as_deref(), Some("forward"));
        assert!(l.of(4).is_none());
        assert!(l.of(99).is_none());
    }

    #[test]
    fn the_site_is_the_module_and_the_op() {
        let mut l = label("forward");
        assert_eq!(l.site(), None);
        l.op = Some(Arc::from("aten::mm"));
        assert_eq!(l.site().as_deref(), Some("aten::mm"));
        l.module = Some(Arc::from("model.h.0.mlp"));
        assert_eq!(l.site().as_deref(), Some("model.h.0.mlp aten::mm"));
        l.op = None;
        assert_eq!(l.site().as_deref(), Some("model.h.0.mlp"));
    }
}
