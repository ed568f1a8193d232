//! `memory doctor`: a real run's memory explained from its trace — where the peak comes from
//! (phase, categories, call sites, what the previous step still holds there), what is kept
//! across steps and the mistake it looks like,
//! what fragments (by replay through the caching allocator, with expandable segments and with
//! the cache emptied as alternatives), each finding with its fix.
//!
//! Not for: ranking the planner's levers for the run (the binary does that with the plan crate,
//! from the run's side JSON) or drawing (see `crate::timeline`).

pub mod carryover;
pub mod curve;
pub mod events;
pub mod fragmentation;
pub mod leaks;
pub mod lifetimes;
pub mod peak;
pub mod phases;
pub mod read;

pub use carryover::Carryover;
pub use curve::Sample;
pub use events::{Action, Event, Events, Frame, Phase};
pub use fragmentation::{FragmentationReport, Oom, ReplayFigures};
pub use leaks::{Finding, Leaks, Mistake, SourceLines};
pub use peak::{Peak, Site};
pub use read::{DoctorReadError, read_trace};

use crate::config::AllocatorConfig;
use serde::Serialize;

/// What to diagnose with.
pub struct DoctorOptions<'a> {
    /// Device capacity for the out-of-memory replays (the trace's own when it states one).
    pub capacity: Option<u64>,
    /// The allocator's settings (`PYTORCH_CUDA_ALLOC_CONF`).
    pub allocator: AllocatorConfig,
    /// How many call sites to list at the peak.
    pub sites: usize,
    /// Reads the user's source lines, where the files are at hand.
    pub source: SourceLines<'a>,
}

/// The diagnosis of one trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnosis {
    pub events: usize,
    pub steps: usize,
    /// Whether phases came from the trace (else read from its Python stacks).
    pub phases_stated: bool,
    /// Whether the trace had Python frames to attribute bytes to.
    pub has_frames: bool,
    pub peak: Option<Peak>,
    /// What the previous step still holds at the peak (a variable reassigned each step), where
    /// it is worth freeing.
    pub carryover: Option<Carryover>,
    pub leaks: Leaks,
    pub fragmentation: FragmentationReport,
    /// What could not be attributed, in words.
    pub limits: Vec<String>,
    /// Live bytes by category over the trace, at most `TIMELINE_POINTS` samples.
    pub timeline: Vec<Sample>,
}

/// The most samples the diagnosis keeps of the live bytes over time.
pub const TIMELINE_POINTS: usize = 600;

impl std::fmt::Debug for DoctorOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DoctorOptions")
            .field("capacity", &self.capacity)
            .field("allocator", &self.allocator)
            .field("sites", &self.sites)
            .finish_non_exhaustive()
    }
}

/// Diagnoses a trace.
pub fn diagnose(events: &Events, options: &DoctorOptions<'_>) -> Diagnosis {
    let timeline = phases::timeline(events);
    let lifetimes = lifetimes::lifetimes(events, &timeline);
    let curve = peak::allocated_curve(events, &lifetimes);
    let peak = peak::peak(events, &timeline, &lifetimes, &curve, options.sites);
    let carryover = peak.as_ref().and_then(|p| {
        carryover::carryover(
            events,
            &timeline,
            &lifetimes,
            p,
            options.sites,
            options.source,
        )
    });
    let leaks = leaks::leaks(events, &timeline, &lifetimes, &curve, options.source);
    let fragmentation =
        fragmentation::fragmentation(events, &timeline, options.capacity, &options.allocator);
    let mut limits = Vec::new();
    if !events.has_frames() {
        limits.push(
            "the trace has no Python frames: bytes are attributed by category and phase only (record with torch.cuda.memory._record_memory_history(stacks=\"python\"))".to_string(),
        );
    }
    if !timeline.stated && timeline.phases.iter().all(Option::is_none) {
        limits.push("no phase could be read: the trace states none and has no frames".into());
    }
    if let Some(reason) = &leaks.unchecked {
        limits.push(reason.clone());
    }
    if options.capacity.is_none() {
        limits.push(
            "no device capacity given (--capacity): out-of-memory replays were not made".into(),
        );
    }
    Diagnosis {
        events: events.events.len(),
        steps: timeline.step_count(),
        phases_stated: timeline.stated,
        has_frames: events.has_frames(),
        peak,
        carryover,
        leaks,
        fragmentation,
        limits,
        timeline: curve::sample(&lifetimes, &curve, TIMELINE_POINTS),
    }
}
