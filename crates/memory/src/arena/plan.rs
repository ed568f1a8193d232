//! Arena plans: the requests of named windows (a training step, an evaluation) recorded once —
//! by a dry run, where the allocator hands out addresses without memory — with each request's
//! lifetime, and an offset in one arena for every request freed within its window. Training
//! repeats the same requests step after step, so a later window with the same key can be served
//! from the plan: no search, no splitting, no cached blocks, the arena only as large as the
//! packing needs.
//!
//! Not for: the packing itself (see `packing`) or serving requests (see `allocator::planned`).

use super::packing::{Interval, pack, peak_live};
use crate::category::Category;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// One request of a window, in request order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PlannedRequest {
    /// Block size (the request rounded as the caching allocator rounds it).
    pub size: u64,
    pub category: Category,
    /// Offset in the arena; `None` for a request that outlives its window (served by the
    /// caching allocator).
    pub offset: Option<u64>,
}

/// The plan of one window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowPlan {
    pub key: String,
    pub requests: Vec<PlannedRequest>,
    /// Arena bytes this window's packing needs.
    pub arena_bytes: u64,
    /// The peak of this window's planned live bytes: no packing needs less.
    pub peak_live: u64,
}

/// Plans of every recorded window that repeats the same way each time it was recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ArenaPlan {
    pub windows: Vec<WindowPlan>,
    /// Keys recorded more than once with different requests or lifetimes: not planned.
    pub unstable: Vec<String>,
}

impl ArenaPlan {
    /// Arena bytes: the largest window's (windows never overlap in time).
    pub fn size(&self) -> u64 {
        self.windows
            .iter()
            .map(|w| w.arena_bytes)
            .max()
            .unwrap_or(0)
    }

    /// The peak of planned live bytes over all windows.
    pub fn peak_live(&self) -> u64 {
        self.windows.iter().map(|w| w.peak_live).max().unwrap_or(0)
    }

    pub fn window(&self, key: &str) -> Option<&WindowPlan> {
        self.windows.iter().find(|w| w.key == key)
    }

    /// Plans one window from its requests and their lifetimes in event order: `(size,
    /// category, start, end)` with `end` `None` when the request outlives the window.
    pub fn plan_window(key: &str, requests: &[Recorded]) -> WindowPlan {
        let planned: Vec<usize> = (0..requests.len())
            .filter(|&i| requests[i].end.is_some())
            .collect();
        let intervals: Vec<Interval> = planned
            .iter()
            .map(|&i| Interval {
                size: requests[i].size,
                start: requests[i].start,
                end: requests[i].end.expect("planned requests end"),
            })
            .collect();
        let (offsets, arena_bytes) = pack(&intervals);
        let mut out: Vec<PlannedRequest> = requests
            .iter()
            .map(|r| PlannedRequest {
                size: r.size,
                category: r.category,
                offset: None,
            })
            .collect();
        for (&i, offset) in planned.iter().zip(offsets) {
            out[i].offset = Some(offset);
        }
        WindowPlan {
            key: key.to_string(),
            requests: out,
            arena_bytes,
            peak_live: peak_live(&intervals),
        }
    }
}

/// One recorded request: block size, category and lifetime in the window's event count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub size: u64,
    pub category: Category,
    pub start: usize,
    pub end: Option<usize>,
}

/// The window being recorded.
#[derive(Debug)]
struct Open {
    key: String,
    events: usize,
    requests: Vec<Recorded>,
    /// Live requests of this window by address.
    live: HashMap<u64, usize>,
}

/// Records the requests of named windows into an [`ArenaPlan`].
#[derive(Debug, Default)]
pub struct Recorder {
    open: Option<Open>,
    recorded: Vec<(String, Vec<Recorded>)>,
    unstable: BTreeSet<String>,
}

impl Recorder {
    /// Starts recording window `key` (ending any open one).
    pub fn begin(&mut self, key: &str) {
        self.end();
        self.open = Some(Open {
            key: key.to_string(),
            events: 0,
            requests: Vec::new(),
            live: HashMap::new(),
        });
    }

    pub fn on_alloc(&mut self, addr: u64, size: u64, category: Category) {
        if let Some(w) = self.open.as_mut() {
            w.live.insert(addr, w.requests.len());
            w.requests.push(Recorded {
                size,
                category,
                start: w.events,
                end: None,
            });
            w.events += 1;
        }
    }

    /// A free; frees of blocks allocated before the window do not concern its plan.
    pub fn on_free(&mut self, addr: u64) {
        if let Some(w) = self.open.as_mut()
            && let Some(i) = w.live.remove(&addr)
        {
            w.requests[i].end = Some(w.events);
            w.events += 1;
        }
    }

    /// Ends the open window; a key seen before must have recorded the same requests.
    pub fn end(&mut self) {
        let Some(w) = self.open.take() else { return };
        match self.recorded.iter().find(|(k, _)| *k == w.key) {
            Some((_, earlier)) if *earlier != w.requests => {
                self.unstable.insert(w.key);
            }
            Some(_) => {}
            None => self.recorded.push((w.key, w.requests)),
        }
    }

    /// The plan of every stable window.
    pub fn finish(mut self) -> ArenaPlan {
        self.end();
        let unstable = self.unstable;
        ArenaPlan {
            windows: self
                .recorded
                .iter()
                .filter(|(k, _)| !unstable.contains(k))
                .map(|(k, r)| ArenaPlan::plan_window(k, r))
                .collect(),
            unstable: unstable.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_that_outlive_the_window_are_left_to_the_caching_allocator() {
        let mut r = Recorder::default();
        r.begin("step");
        r.on_alloc(1, 1024, Category::Activation);
        r.on_alloc(2, 512, Category::OptimizerState); // kept
        r.on_free(99); // allocated before the window: ignored
        r.on_free(1);
        r.end();
        let plan = r.finish();
        let w = plan.window("step").unwrap();
        assert_eq!(w.requests[0].offset, Some(0));
        assert_eq!(w.requests[1].offset, None);
        assert_eq!((w.arena_bytes, w.peak_live), (1024, 1024));
    }

    #[test]
    fn a_window_that_changes_between_recordings_is_not_planned() {
        let mut r = Recorder::default();
        for size in [1024, 2048] {
            r.begin("step");
            r.on_alloc(1, size, Category::Activation);
            r.on_free(1);
        }
        r.begin("eval");
        r.on_alloc(1, 512, Category::Activation);
        r.on_free(1);
        let plan = r.finish();
        assert_eq!(plan.unstable, vec!["step".to_string()]);
        assert!(plan.window("step").is_none());
        assert_eq!(plan.size(), 512);
    }
}
