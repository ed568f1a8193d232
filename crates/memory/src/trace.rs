//! The allocator's event trace: alloc / free / segment / oom events with size, category, name,
//! time and the step and phase they happened in. Exported as a PyTorch snapshot or as JSON.
//!
//! Not for: replaying traces (see `replay`), which reads a simpler event format.

use crate::category::Category;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// PyTorch's `TraceEntry.action` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
}

impl TraceAction {
    pub fn name(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
            TraceAction::Snapshot => "snapshot",
        }
    }
}

/// One event. For `oom`, `addr` holds the device's free bytes, as PyTorch's `device_free`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceEntry {
    pub action: TraceAction,
    pub addr: u64,
    /// Requested bytes for alloc/free, segment bytes for segment events, rounded request for oom.
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
    pub time_us: u64,
    pub step: u64,
    pub phase: Arc<str>,
}

/// Recording state: off by default; a bounded ring when on (PyTorch's `max_entries`).
#[derive(Debug)]
pub struct Trace {
    enabled: bool,
    max_entries: usize,
    entries: VecDeque<TraceEntry>,
    start: Instant,
    step: u64,
    phase: Arc<str>,
}

impl Default for Trace {
    fn default() -> Self {
        Trace {
            enabled: false,
            max_entries: usize::MAX,
            entries: VecDeque::new(),
            start: Instant::now(),
            step: 0,
            phase: Arc::from(""),
        }
    }
}

impl Trace {
    /// Turns recording on (keeping at most `max_entries`, oldest dropped) or off.
    pub fn record_history(&mut self, enabled: bool, max_entries: usize) {
        self.enabled = enabled;
        self.max_entries = max_entries.max(1);
        while self.entries.len() > self.max_entries {
            self.entries.pop_front();
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Marks the training step that following events belong to.
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// Marks the phase (`forward`, `backward`, `optimizer`, `validation`, …) of following events.
    pub fn set_phase(&mut self, phase: &str) {
        if &*self.phase != phase {
            self.phase = Arc::from(phase);
        }
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn phase(&self) -> &str {
        &self.phase
    }

    pub(crate) fn record(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        tag: Option<(Category, Option<Arc<str>>)>,
    ) {
        if !self.enabled {
            return;
        }
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
        }
        let (category, name) = match tag {
            Some((c, n)) => (Some(c), n),
            None => (None, None),
        };
        self.entries.push_back(TraceEntry {
            action,
            addr,
            size,
            category,
            name,
            time_us: self.start.elapsed().as_micros() as u64,
            step: self.step,
            phase: self.phase.clone(),
        });
    }

    pub fn entries(&self) -> impl ExactSizeIterator<Item = &TraceEntry> {
        self.entries.iter()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }
}
