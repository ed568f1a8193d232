//! The doctor's view of a trace: allocation and free events with their Python stacks, interned
//! so that a trace of millions of events holds each distinct frame and stack once. Filled by the
//! readers (`read`) from a PyTorch snapshot or headroom's JSON trace; read by every analysis.
//!
//! Not for: replaying through the allocator with no stacks (see `crate::replay`).

use crate::category::Category;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;

/// One Python frame as PyTorch records it (`filename`, `line`, `name`).
pub use crate::snapshot::Frame;

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} ({})", self.filename, self.line, self.name)
    }
}

/// Where in a training step an event happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Forward,
    Backward,
    Optimizer,
    ZeroGrad,
    Evaluation,
}

impl Phase {
    pub const fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer step",
            Phase::ZeroGrad => "zero_grad",
            Phase::Evaluation => "evaluation",
        }
    }

    /// Reads the phase names a trace may carry (headroom's, the tracer's, PyTorch's
    /// `record_function` labels such as `## forward ##`).
    pub fn parse(s: &str) -> Option<Phase> {
        let t = s.trim_matches(|c: char| c == '#' || c.is_whitespace());
        match t.to_ascii_lowercase().as_str() {
            "forward" | "fwd" => Some(Phase::Forward),
            "backward" | "bwd" => Some(Phase::Backward),
            "optimizer" | "optimizer_step" | "optimizer step" | "step" | "optim" => {
                Some(Phase::Optimizer)
            }
            "zero_grad" | "zero-grad" => Some(Phase::ZeroGrad),
            "evaluation" | "eval" | "validation" => Some(Phase::Evaluation),
            _ => None,
        }
    }
}

/// Whether an event allocates or frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc,
    Free,
    /// No memory changes: the trace marks a phase (a `zero_grad` that frees nothing, a
    /// `record_function` range) so the analyses see it.
    Mark,
}

/// One event; its stack is an index into [`Events::stacks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub action: Action,
    pub addr: u64,
    /// Bytes (on a free, the bytes of the block freed, when the trace says).
    pub size: u64,
    pub stack: u32,
    /// The category the trace states, if any.
    pub category: Option<Category>,
    /// The phase the trace states, if any.
    pub phase: Option<Phase>,
    /// The training step the trace states, if any (0-based).
    pub step: Option<u32>,
}

/// A whole trace with interned frames and stacks.
#[derive(Clone, Debug, Default)]
pub struct Events {
    pub frames: Vec<Frame>,
    /// Each stack lists frame indices, innermost first (PyTorch's order).
    pub stacks: Vec<Vec<u32>>,
    pub events: Vec<Event>,
    /// Whether an event the trace leaves without a phase takes its stack's even when other
    /// events state theirs: a PyTorch snapshot, where only the recording thread's allocations
    /// carry `headroom.record`'s tags and autograd's threads' carry none.
    pub untagged_from_stacks: bool,
    frame_ids: HashMap<Frame, u32>,
    stack_ids: HashMap<Vec<u32>, u32>,
}

impl Events {
    /// An empty trace whose stack 0 is the empty stack.
    pub fn new() -> Events {
        let mut e = Events::default();
        e.intern_stack(Vec::new());
        e
    }

    pub fn intern_frame(&mut self, frame: Frame) -> u32 {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }

    pub fn intern_stack(&mut self, stack: Vec<u32>) -> u32 {
        if let Some(&id) = self.stack_ids.get(&stack) {
            return id;
        }
        let id = self.stacks.len() as u32;
        self.stacks.push(stack.clone());
        self.stack_ids.insert(stack, id);
        id
    }

    /// The frames of a stack, innermost first.
    pub fn stack(&self, id: u32) -> impl Iterator<Item = &Frame> {
        self.stacks[id as usize]
            .iter()
            .map(|&f| &self.frames[f as usize])
    }

    pub fn push(&mut self, event: Event) {
        self.events.push(event);
    }

    /// Whether any event carries a Python frame.
    pub fn has_frames(&self) -> bool {
        !self.frames.is_empty()
    }
}
