//! Fragmentation, by replay: the trace's allocations run through the caching allocator (as
//! configured, under a capacity when one is known), reserved against allocated at the peak, and
//! for an out-of-memory the failed request against the largest free block, and whether the run
//! would have gone through with expandable segments or with the cache emptied when the failing
//! phase began — each answered by replaying again, not by a rule of thumb.
//!
//! Not for: the allocator itself (see `crate::allocator`).

use super::events::{Action, Events, Frame, Phase};
use super::peak::call_site;
use super::phases::Timeline;
use crate::allocator::CachingAllocator;
use crate::config::AllocatorConfig;
use crate::fragmentation::Fragmentation;
use crate::source::VirtualSource;
use serde::Serialize;
use std::collections::HashMap;

/// The first allocation a replay could not serve.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Oom {
    pub event_index: usize,
    pub requested_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// The largest block cached memory could have served without reserving more.
    pub largest_free_block_bytes: u64,
    /// Allocated + request ≤ capacity: the bytes existed, not in one piece.
    pub fragmentation_bound: bool,
    pub phase: Option<Phase>,
    /// Where the failed request was made: its innermost user frame (`None` without frames).
    pub frame: Option<Frame>,
}

/// One replay's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayFigures {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub fragmentation: Fragmentation,
    pub first_oom: Option<Oom>,
    pub ooms: usize,
}

/// What the replays found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FragmentationReport {
    pub capacity_bytes: Option<u64>,
    /// The allocator as configured.
    pub caching: ReplayFigures,
    /// With expandable segments (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`).
    pub expandable: ReplayFigures,
    /// With `torch.cuda.empty_cache()` when the phase that failed began (only after an OOM).
    pub emptied_before_failing_phase: Option<ReplayFigures>,
}

/// The capacity of a replay without one: 1 TiB, more than any device, small enough for the
/// expandable segments' page map.
const UNLIMITED: u64 = 1 << 40;

/// Replays the events under `capacity` (unlimited without), calling `empty_cache` before the
/// events listed in `empty_cache_at`.
pub fn replay(
    events: &Events,
    timeline: &Timeline,
    capacity: Option<u64>,
    config: AllocatorConfig,
    empty_cache_at: &[usize],
) -> ReplayFigures {
    let cap = capacity.unwrap_or(UNLIMITED);
    let mut a = CachingAllocator::new(cap, config, Box::new(VirtualSource::default()));
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut first_oom = None;
    let mut ooms = 0;
    let mut empties = empty_cache_at.iter().peekable();
    let mut at_peak: Option<(u64, Fragmentation)> = None;
    for (i, e) in events.events.iter().enumerate() {
        while empties.next_if(|&&k| k <= i).is_some() {
            a.empty_cache();
        }
        match e.action {
            Action::Alloc => match a.malloc(
                e.size,
                e.category.unwrap_or(crate::category::Category::Other),
                None,
            ) {
                Ok(got) => {
                    if let Some(old) = live.insert(e.addr, got.addr) {
                        let _ = a.free(old);
                    }
                    if at_peak.as_ref().is_none_or(|(p, _)| a.allocated() > *p) {
                        at_peak = Some((a.allocated(), Fragmentation::of(&a)));
                    }
                }
                Err(oom) => {
                    ooms += 1;
                    if first_oom.is_none() {
                        let f = Fragmentation::of(&a);
                        first_oom = Some(Oom {
                            event_index: i,
                            requested_bytes: e.size,
                            allocated_bytes: oom.allocated,
                            reserved_bytes: oom.reserved,
                            largest_free_block_bytes: f.largest_free_block_bytes,
                            fragmentation_bound: oom.allocated + e.size <= cap,
                            phase: timeline.phases[i],
                            frame: call_site(events, e.stack)
                                .map(|f| events.frames[f as usize].clone()),
                        });
                    }
                }
            },
            Action::Free => {
                if let Some(addr) = live.remove(&e.addr) {
                    a.free(addr)
                        .expect("the replay frees only what it allocated");
                }
            }
            Action::Mark => {}
        }
    }
    let stats = a.stats();
    ReplayFigures {
        peak_allocated_bytes: stats.allocated_bytes.all.peak as u64,
        peak_reserved_bytes: stats.reserved_bytes.all.peak as u64,
        fragmentation: at_peak.map_or_else(|| Fragmentation::of(&a), |(_, f)| f),
        first_oom,
        ooms,
    }
}

/// The first event of the run of events in `phase` that contains `index`.
fn phase_start(timeline: &Timeline, index: usize) -> usize {
    let phase = timeline.phases[index];
    let mut i = index;
    while i > 0 && (timeline.phases[i - 1] == phase || timeline.phases[i - 1].is_none()) {
        i -= 1;
    }
    i
}

pub fn fragmentation(
    events: &Events,
    timeline: &Timeline,
    capacity: Option<u64>,
    config: &AllocatorConfig,
) -> FragmentationReport {
    let caching = replay(events, timeline, capacity, config.clone(), &[]);
    let expandable = replay(
        events,
        timeline,
        capacity,
        AllocatorConfig {
            expandable_segments: true,
            ..config.clone()
        },
        &[],
    );
    let emptied_before_failing_phase = caching.first_oom.as_ref().map(|oom| {
        let at = phase_start(timeline, oom.event_index);
        replay(events, timeline, capacity, config.clone(), &[at])
    });
    FragmentationReport {
        capacity_bytes: capacity,
        caching,
        expandable,
        emptied_before_failing_phase,
    }
}
