//! Every allocation's lifetime (the event that made it, the one that freed it) and its
//! category: as the trace states it, or read from when it lived, as MemTracker's categories
//! read: made before the first backward and never freed (parameter), made by an optimizer step and kept
//! (optimizer state), made in backward and alive when the optimizer steps (gradient), made in
//! forward and freed in backward (activation), anything shorter (temporary).
//!
//! Not for: deciding what is a leak (see `leaks`).

use super::events::{Action, Events, Phase};
use super::phases::Timeline;
use crate::category::Category;
use std::collections::HashMap;

/// One allocation from its alloc event to its free (or the trace's end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub alloc: usize,
    /// The free event; `None` when alive at the trace's end.
    pub free: Option<usize>,
    pub size: u64,
    pub stack: u32,
    pub category: Category,
    /// Whether the category came from the trace rather than from the lifetime.
    pub stated: bool,
}

impl Lifetime {
    /// Alive just after event `i`.
    pub fn alive_after(&self, i: usize) -> bool {
        self.alloc <= i && self.free.is_none_or(|f| f > i)
    }

    /// Whether it lives across steps by design: model and optimizer state, and what a trace
    /// states as `other` (module buffers, the library workspaces made once and kept:
    /// cuBLASLt's, a cached cuBLAS one).
    pub fn kept_by_design(&self) -> bool {
        match self.category {
            Category::Parameter | Category::OptimizerState | Category::Gradient => true,
            Category::Other => self.stated,
            _ => false,
        }
    }
}

/// Pairs allocations with their frees (a free of an unknown address, as a PyTorch ring that
/// lost the alloc leaves, is skipped) and gives each its category.
pub fn lifetimes(events: &Events, timeline: &Timeline) -> Vec<Lifetime> {
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut out: Vec<Lifetime> = Vec::new();
    for (i, e) in events.events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                // An address seen again whose free fell outside the ring: close the old one.
                if let Some(old) = open.insert(e.addr, out.len()) {
                    out[old].free.get_or_insert(i);
                }
                out.push(Lifetime {
                    alloc: i,
                    free: None,
                    size: e.size,
                    stack: e.stack,
                    category: e.category.unwrap_or(Category::Other),
                    stated: e.category.is_some(),
                });
            }
            Action::Free => {
                if let Some(k) = open.remove(&e.addr) {
                    out[k].free = Some(i);
                }
            }
            Action::Mark => {}
        }
    }
    let first_backward = timeline
        .phases
        .iter()
        .position(|p| *p == Some(Phase::Backward));
    // The first optimizer event of each step.
    let mut optimizer_of_step: Vec<Option<usize>> = vec![None; timeline.step_count()];
    for (i, p) in timeline.phases.iter().enumerate() {
        let slot = &mut optimizer_of_step[timeline.steps[i] as usize];
        if *p == Some(Phase::Optimizer) && slot.is_none() {
            *slot = Some(i);
        }
    }
    for l in out.iter_mut().filter(|l| !l.stated) {
        l.category = read_category(l, timeline, first_backward, &optimizer_of_step);
    }
    out
}

fn read_category(
    l: &Lifetime,
    t: &Timeline,
    first_backward: Option<usize>,
    optimizer_of_step: &[Option<usize>],
) -> Category {
    let phase = t.phases[l.alloc];
    let step = t.steps[l.alloc];
    let next_step_start = t.step_starts.get(step as usize).copied();
    let kept_past_step = match (l.free, next_step_start) {
        (None, _) => true,
        (Some(f), Some(next)) => f >= next,
        (Some(_), None) => false,
    };
    let freed_in = |p: Phase| l.free.is_some_and(|f| t.phases[f] == Some(p));
    // Made before the first backward and never freed: the model's weights and buffers (a
    // first step's tensor kept to the end reads the same; later steps' show it).
    if first_backward.is_some_and(|b| l.alloc < b) && l.free.is_none() {
        return Category::Parameter;
    }
    match phase {
        Some(Phase::Optimizer) if kept_past_step => Category::OptimizerState,
        Some(Phase::Backward) => match optimizer_of_step[step as usize].filter(|&i| i > l.alloc) {
            Some(i) if l.alive_after(i) => Category::Gradient,
            _ => Category::Temporary,
        },
        Some(Phase::Forward | Phase::Evaluation) if freed_in(Phase::Backward) => {
            Category::Activation
        }
        _ => Category::Temporary,
    }
}
