//! The memory timeline: allocated bytes per category and reserved bytes after each traced event,
//! reduced to at most a given number of points (keeping each bucket's peak), with the step and
//! phase boundaries. The data behind the timeline picture; the picture itself is drawn by the CLI.
//!
//! Not for: drawing.

use crate::category::Category;
use crate::trace::{TraceAction, TraceEntry};
use serde::Serialize;

/// One point of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// Index of the event this point shows (after it happened).
    pub event: usize,
    pub time_us: u64,
    pub step: u64,
    /// Allocated bytes per category, in `Category::ALL` order.
    pub by_category: [u64; Category::COUNT],
    pub reserved: u64,
}

impl TimelinePoint {
    pub fn allocated(&self) -> u64 {
        self.by_category.iter().sum()
    }
}

/// Timeline series and markers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timeline {
    pub points: Vec<TimelinePoint>,
    /// `(event index, label)` where a new step or phase begins.
    pub markers: Vec<(usize, String)>,
    /// Event indices of OOMs.
    pub ooms: Vec<usize>,
}

/// Builds the timeline from trace entries (oldest first), keeping at most `max_points` points:
/// events are bucketed and each bucket keeps its point of highest allocated bytes, so peaks
/// survive the reduction; the last event's point is always kept. Bytes are requested bytes.
pub fn timeline<'a>(
    entries: impl IntoIterator<Item = &'a TraceEntry>,
    max_points: usize,
) -> Timeline {
    let mut current = [0u64; Category::COUNT];
    let mut reserved = 0u64;
    let mut all = Vec::new();
    let mut markers = Vec::new();
    let mut ooms = Vec::new();
    let mut last_label: Option<String> = None;
    // Sizes of live blocks by address: frees in the trace carry requested bytes.
    let mut live: std::collections::HashMap<u64, (Category, u64)> =
        std::collections::HashMap::new();
    for (i, e) in entries.into_iter().enumerate() {
        let label = if e.phase.is_empty() {
            format!("step {}", e.step)
        } else {
            format!("step {} {}", e.step, e.phase)
        };
        if last_label.as_deref() != Some(label.as_str()) {
            markers.push((i, label.clone()));
            last_label = Some(label);
        }
        match e.action {
            TraceAction::Alloc => {
                let c = e.category.unwrap_or(Category::Other);
                current[c.index()] += e.size;
                live.insert(e.addr, (c, e.size));
            }
            TraceAction::FreeCompleted => {
                if let Some((c, size)) = live.remove(&e.addr) {
                    current[c.index()] -= size;
                }
            }
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => reserved += e.size,
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                reserved = reserved.saturating_sub(e.size)
            }
            TraceAction::Oom => ooms.push(i),
            TraceAction::FreeRequested | TraceAction::Snapshot => {}
        }
        all.push(TimelinePoint {
            event: i,
            time_us: e.time_us,
            step: e.step,
            by_category: current,
            reserved,
        });
    }
    let max_points = max_points.max(2);
    let points = if all.len() <= max_points {
        all
    } else {
        // Buckets keep their peak; the final state is always the last point.
        let last = all.last().cloned().expect("more points than max_points");
        let bucket = (all.len() - 1).div_ceil(max_points - 1);
        let mut reduced: Vec<TimelinePoint> = all[..all.len() - 1]
            .chunks(bucket)
            .map(|c| {
                c.iter()
                    .max_by_key(|p| (p.allocated(), p.reserved))
                    .expect("non-empty chunk")
                    .clone()
            })
            .collect();
        reduced.push(last);
        reduced
    };
    Timeline {
        points,
        markers,
        ooms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::MIB;
    use crate::{AllocatorConfig, CachingAllocator, VirtualSource};

    #[test]
    fn timeline_follows_categories_and_keeps_the_peak_when_reduced() {
        let mut a = CachingAllocator::new(
            1 << 34,
            AllocatorConfig::default(),
            Box::new(VirtualSource::default()),
        );
        a.trace_mut().record_history(true, usize::MAX);
        let w = a.malloc(12 * MIB, Category::Parameter, None).unwrap();
        let mut acts = Vec::new();
        for _ in 0..50 {
            acts.push(a.malloc(MIB, Category::Activation, None).unwrap());
        }
        for x in acts {
            a.free(x.addr).unwrap();
        }
        let _ = w;
        let t = timeline(a.trace().entries(), 10);
        assert!(t.points.len() <= 10);
        let peak = t.points.iter().map(|p| p.allocated()).max().unwrap();
        // Requested bytes at the peak: 12 MiB of parameters + 50 × 1 MiB of activations.
        assert_eq!(peak, 62 * MIB);
        let last = t.points.last().unwrap();
        assert_eq!(last.by_category[Category::Parameter.index()], 12 * MIB);
        assert_eq!(last.by_category[Category::Activation.index()], 0);
        assert!(last.reserved >= 62 * MIB);
    }
}
