//! Serving requests from a planned arena. With an [`ArenaLayout`] installed, the allocator holds
//! one arena segment of the layout's size; inside a window the caller opened with a key the layout
//! knows, the k-th request gets the k-th planned offset when it asks for the planned size and
//! category, and requests the layout leaves out (those that outlive the window but not the run) go
//! to the caching pools. Permanent requests (model states) take the layout's permanent region at
//! the bottom of the arena and stay there. A request that differs from the layout — another size, another category, more requests
//! than planned, or an offset still covered by a live arena block — is a deviation: it and the
//! rest of the window are served by the caching pools, and the deviation is counted and kept
//! for the report. Statistics, windows and traces count arena blocks like any other, in the
//! large pool.
//!
//! Not for: making layouts (see `crate::arena`).

use super::CachingAllocator;
use crate::arena::{ArenaLayout, Recorder};
use crate::category::Category;
use crate::rounding::Pool;
use crate::size::format_bytes;
use crate::trace::TraceAction;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// At most this many deviations are described in the report (all are counted).
const DESCRIBED: usize = 8;

/// The arena could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArenaError {
    #[error(
        "the planned arena needs {} but only {} of the device's {} is not reserved: lower the micro-batch or use --allocator caching",
        format_bytes(*needed),
        format_bytes(*free),
        format_bytes(*capacity)
    )]
    TooLarge {
        needed: u64,
        free: u64,
        capacity: u64,
    },
    #[error("the device could not provide the arena segment: {0}")]
    Source(String),
    #[error("a plan is already installed")]
    AlreadyInstalled,
}

/// How the arena served the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct ArenaReport {
    /// Bytes of the arena segment.
    pub arena_bytes: u64,
    /// The layout's peak of live arena bytes (the packing's lower bound).
    pub planned_peak_live: u64,
    /// Windows served to their end as planned.
    pub windows_as_planned: u64,
    /// Windows that deviated from the layout.
    pub windows_deviated: u64,
    /// Windows opened with a key the layout does not have (served by the caching pools).
    pub windows_unplanned: u64,
    /// Requests served from the arena.
    pub requests_from_arena: u64,
    /// Requests the layout leaves to the caching pools (they outlive their window).
    pub requests_passed_on: u64,
    /// The first deviations, described.
    pub deviations: Vec<String>,
    /// Keys the recording saw change between repetitions (never planned).
    pub unstable_windows: Vec<String>,
}

/// A live block in the arena.
#[derive(Debug)]
struct ArenaBlock {
    size: u64,
    requested: u64,
    category: Category,
    name: Option<Arc<str>>,
}

/// The window being served: the layout's window index and the next request's index.
#[derive(Debug, Clone, Copy)]
struct Serving {
    window: usize,
    next: usize,
}

/// The arena segment and the layout it serves.
#[derive(Debug)]
pub(super) struct Arena {
    plan: ArenaLayout,
    base: u64,
    size: u64,
    serving: Option<Serving>,
    /// Key of the open window, whether served or not.
    open: Option<String>,
    /// Live arena blocks by offset.
    live: BTreeMap<u64, ArenaBlock>,
    report: ArenaReport,
}

impl Arena {
    fn deviate(&mut self, why: String) {
        let key = self.open.clone().unwrap_or_default();
        self.serving = None;
        self.report.windows_deviated += 1;
        if self.report.deviations.len() < DESCRIBED {
            self.report
                .deviations
                .push(format!("window \"{key}\": {why}"));
        }
    }

    /// Whether `[offset, offset + size)` is free of live arena blocks.
    fn is_free(&self, offset: u64, size: u64) -> bool {
        let below = self.live.range(..=offset).next_back();
        let above = self.live.range(offset..).next();
        below.is_none_or(|(o, b)| o + b.size <= offset)
            && above.is_none_or(|(o, _)| *o >= offset + size)
    }
}

impl CachingAllocator {
    /// Starts recording the requests of the windows opened from now on (a dry run's device).
    pub fn record_windows(&mut self) {
        self.recorder = Some(Recorder::default());
    }

    /// The layout of the windows recorded so far, ending the recording.
    pub fn take_recorded_layout(&mut self) -> Option<ArenaLayout> {
        self.recorder.take().map(Recorder::finish)
    }

    /// Installs `layout`: reserves its arena as one segment (counted in `reserved`).
    pub fn install_layout(&mut self, plan: ArenaLayout) -> Result<(), ArenaError> {
        if self.arena.is_some() {
            return Err(ArenaError::AlreadyInstalled);
        }
        // The source hands out multiples of 512 bytes; planned sizes already are.
        let size = plan.size().max(512);
        if self.reserved() + size > self.capacity {
            return Err(ArenaError::TooLarge {
                needed: size,
                free: self.capacity.saturating_sub(self.reserved()),
                capacity: self.capacity,
            });
        }
        let base = self
            .source
            .allocate(size)
            .map_err(|e| ArenaError::Source(e.to_string()))?;
        self.stats.segment.increase(Pool::Large, 1);
        self.stats.reserved_bytes.increase(Pool::Large, size);
        self.stats.num_device_alloc += 1;
        self.trace
            .record(TraceAction::SegmentAlloc, base, size, None);
        let report = ArenaReport {
            arena_bytes: size,
            planned_peak_live: plan.peak_live(),
            unstable_windows: plan.unstable.clone(),
            ..ArenaReport::default()
        };
        self.arena = Some(Arena {
            plan,
            base,
            size,
            serving: None,
            open: None,
            live: BTreeMap::new(),
            report,
        });
        Ok(())
    }

    /// Opens window `key`: served from the layout when the layout has it and no arena block of an
    /// earlier window (outside the permanent region) is still live. Also starts recording it when recording.
    pub fn begin_window(&mut self, key: &str) {
        self.end_window();
        if let Some(r) = self.recorder.as_mut() {
            r.begin(key);
        }
        let Some(arena) = self.arena.as_mut() else {
            return;
        };
        arena.open = Some(key.to_string());
        match arena.plan.windows.iter().position(|w| w.key == key) {
            None => arena.report.windows_unplanned += 1,
            Some(_)
                if arena
                    .live
                    .range(arena.plan.permanent_bytes..)
                    .next()
                    .is_some() =>
            {
                let n = arena.live.range(arena.plan.permanent_bytes..).count();
                arena.deviate(format!(
                    "{n} arena blocks of an earlier window are still live"
                ));
            }
            Some(window) => arena.serving = Some(Serving { window, next: 0 }),
        }
    }

    /// Closes the open window; a window that made fewer requests than planned deviated.
    pub fn end_window(&mut self) {
        if let Some(r) = self.recorder.as_mut() {
            r.end();
        }
        let Some(arena) = self.arena.as_mut() else {
            return;
        };
        if let Some(s) = arena.serving {
            let planned = arena.plan.windows[s.window].requests.len();
            if s.next < planned {
                arena.deviate(format!(
                    "{} requests of {planned} planned were made",
                    s.next
                ));
            } else {
                arena.serving = None;
                arena.report.windows_as_planned += 1;
            }
        }
        arena.open = None;
    }

    /// How the arena served the run, if a layout is installed.
    pub fn arena_report(&self) -> Option<ArenaReport> {
        self.arena.as_ref().map(|a| a.report.clone())
    }

    /// Serves the request from the arena when the open window's layout says so.
    pub(super) fn malloc_planned(
        &mut self,
        rounded: u64,
        requested: u64,
        category: Category,
        name: &Option<Arc<str>>,
    ) -> Option<super::Allocation> {
        let arena = self.arena.as_mut()?;
        let s = arena.serving?;
        let Some(&planned) = arena.plan.windows[s.window].requests.get(s.next) else {
            arena.deviate(format!("more requests than the {} planned", s.next));
            return None;
        };
        if planned.size != rounded || planned.category != category {
            arena.deviate(format!(
                "request {} ({}) is {} of {}, planned {} of {}",
                s.next,
                name.as_deref().unwrap_or("unnamed"),
                format_bytes(rounded),
                category,
                format_bytes(planned.size),
                planned.category
            ));
            return None;
        }
        let Some(offset) = planned.offset else {
            arena.serving = Some(Serving {
                next: s.next + 1,
                ..s
            });
            arena.report.requests_passed_on += 1;
            return None;
        };
        if !arena.is_free(offset, rounded) {
            arena.deviate(format!(
                "request {}'s planned bytes are still held (lifetimes differ from the plan)",
                s.next
            ));
            return None;
        }
        arena.serving = Some(Serving {
            next: s.next + 1,
            ..s
        });
        arena.report.requests_from_arena += 1;
        arena.live.insert(
            offset,
            ArenaBlock {
                size: rounded,
                requested,
                category,
                name: name.clone(),
            },
        );
        let addr = arena.base + offset;
        Some(self.count_alloc(
            Pool::Large,
            addr,
            rounded,
            requested,
            category,
            name.clone(),
        ))
    }

    /// Frees `addr` if it is an arena block; `false` if it is not one.
    pub(super) fn free_planned(&mut self, addr: u64) -> bool {
        let Some(arena) = self.arena.as_mut() else {
            return false;
        };
        if addr < arena.base || addr >= arena.base + arena.size {
            return false;
        }
        let Some(b) = arena.live.remove(&(addr - arena.base)) else {
            return false;
        };
        let tag =
            self.count_free_requested(Pool::Large, addr, b.size, b.requested, b.category, b.name);
        self.count_free_completed(Pool::Large, addr, b.size, b.requested, tag);
        true
    }

    /// The arena as one segment of its live blocks and the gaps between them.
    pub(super) fn arena_view(&self) -> Option<super::SegmentView> {
        use super::{BlockState, BlockView};
        let arena = self.arena.as_ref()?;
        let mut blocks = Vec::new();
        let mut at = 0;
        let gap = |from: u64, to: u64| BlockView {
            address: arena.base + from,
            size: to - from,
            requested_size: 0,
            state: BlockState::Inactive,
            category: None,
            name: None,
        };
        for (&offset, b) in &arena.live {
            if offset > at {
                blocks.push(gap(at, offset));
            }
            blocks.push(BlockView {
                address: arena.base + offset,
                size: b.size,
                requested_size: b.requested,
                state: BlockState::ActiveAllocated,
                category: Some(b.category),
                name: b.name.clone(),
            });
            at = offset + b.size;
        }
        if at < arena.size {
            blocks.push(gap(at, arena.size));
        }
        Some(super::SegmentView {
            address: arena.base,
            total_size: arena.size,
            pool: Pool::Large,
            is_expandable: false,
            blocks,
        })
    }
}
