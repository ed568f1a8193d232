//! Arena layouts: the requests of named windows (a training step, an evaluation) recorded once —
//! by a dry run, where the allocator hands out addresses without memory — with each request's
//! lifetime, and an offset in one arena for every request freed within its window. Training
//! repeats the same requests step after step, so a later window with the same key can be served
//! from the layout: no search, no splitting, no cached blocks, the arena only as large as the
//! packing needs.
//!
//! Requests of a window recorded once that outlive it and are still live when the recording
//! ends (parameters, gradients, master weights and optimizer states, made while the model is
//! built and in the first step) are *permanent*: they get consecutive offsets at the bottom of
//! the arena, in the order they were made, and every window's packing sits above them. Requests
//! that outlive their window but are freed later, and those of a repeating window (each
//! repetition would keep one more), are left to the caching pools.
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
    /// Offset in the arena; `None` for a request that outlives its window but not the
    /// recording (served by the caching allocator).
    pub offset: Option<u64>,
    /// Never freed: its offset is in the permanent region at the bottom of the arena.
    pub permanent: bool,
}

/// The layout of one window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowLayout {
    pub key: String,
    pub requests: Vec<PlannedRequest>,
    /// Arena bytes this window's packing needs above the permanent region.
    pub arena_bytes: u64,
    /// The peak of this window's planned live bytes, the permanent ones aside: no packing
    /// needs less.
    pub peak_live: u64,
}

/// Layouts of every recorded window that repeats the same way each time it was recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ArenaLayout {
    pub windows: Vec<WindowLayout>,
    /// Keys recorded more than once with different requests or lifetimes: not planned.
    pub unstable: Vec<String>,
    /// Bytes of the permanent region at the bottom of the arena.
    pub permanent_bytes: u64,
}

impl ArenaLayout {
    /// Arena bytes: the permanent region and the largest window's packing above it (windows
    /// never overlap in time).
    pub fn size(&self) -> u64 {
        let windows = self.windows.iter().map(|w| w.arena_bytes).max();
        self.permanent_bytes + windows.unwrap_or(0)
    }

    /// The peak of planned live bytes: the permanent ones and the largest window's peak.
    pub fn peak_live(&self) -> u64 {
        let windows = self.windows.iter().map(|w| w.peak_live).max();
        self.permanent_bytes + windows.unwrap_or(0)
    }

    pub fn window(&self, key: &str) -> Option<&WindowLayout> {
        self.windows.iter().find(|w| w.key == key)
    }

    /// Lays out one window from its requests and their lifetimes in event order: `(size,
    /// category, start, end)` with `end` `None` when the request outlives the window.
    pub fn lay_out_window(key: &str, requests: &[Recorded]) -> WindowLayout {
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
                permanent: false,
            })
            .collect();
        for (&i, offset) in planned.iter().zip(offsets) {
            out[i].offset = Some(offset);
        }
        WindowLayout {
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
    /// Which recorded window this is (every window counts, repeated keys too).
    instance: usize,
    events: usize,
    requests: Vec<Recorded>,
    /// Live requests of this window by address.
    live: HashMap<u64, usize>,
}

/// Records the requests of named windows into an [`ArenaLayout`].
#[derive(Debug, Default)]
pub struct Recorder {
    open: Option<Open>,
    /// The first recording of each key: its instance and requests.
    recorded: Vec<(String, usize, Vec<Recorded>)>,
    unstable: BTreeSet<String>,
    instances: usize,
    /// Requests that outlived their window and have not been freed since, by address:
    /// (instance, request index).
    outliving: HashMap<u64, (usize, usize)>,
    /// Keys recorded more than once.
    repeated: BTreeSet<String>,
}

impl Recorder {
    /// Starts recording window `key` (ending any open one).
    pub fn begin(&mut self, key: &str) {
        self.end();
        self.instances += 1;
        self.open = Some(Open {
            key: key.to_string(),
            instance: self.instances,
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

    /// A free; frees of blocks allocated before the window do not concern its layout, but one
    /// of a request that outlived its window makes that request not permanent.
    pub fn on_free(&mut self, addr: u64) {
        if let Some(w) = self.open.as_mut()
            && let Some(i) = w.live.remove(&addr)
        {
            w.requests[i].end = Some(w.events);
            w.events += 1;
            return;
        }
        self.outliving.remove(&addr);
    }

    /// Ends the open window; a key seen before must have recorded the same requests.
    pub fn end(&mut self) {
        let Some(w) = self.open.take() else { return };
        for (&addr, &i) in &w.live {
            self.outliving.insert(addr, (w.instance, i));
        }
        match self.recorded.iter().find(|(k, ..)| *k == w.key) {
            Some((_, _, earlier)) if *earlier != w.requests => {
                self.repeated.insert(w.key.clone());
                self.unstable.insert(w.key);
            }
            Some(_) => {
                self.repeated.insert(w.key);
            }
            None => self.recorded.push((w.key, w.instance, w.requests)),
        }
    }

    /// The layout of every stable window, with the permanent region below them.
    pub fn finish(mut self) -> ArenaLayout {
        self.end();
        let unstable = self.unstable;
        let permanent: BTreeSet<(usize, usize)> = self.outliving.into_values().collect();
        let stable: Vec<&(String, usize, Vec<Recorded>)> = self
            .recorded
            .iter()
            .filter(|(k, ..)| !unstable.contains(k))
            .collect();
        // Permanent requests, bottom up in the order they were made (windows in order).
        let mut offset = 0u64;
        let mut fixed: HashMap<(usize, usize), u64> = HashMap::new();
        for (key, instance, requests) in &stable {
            if self.repeated.contains(key) {
                continue;
            }
            for (i, r) in requests.iter().enumerate() {
                if permanent.contains(&(*instance, i)) {
                    fixed.insert((*instance, i), offset);
                    offset += r.size;
                }
            }
        }
        let windows = stable
            .iter()
            .map(|(key, instance, requests)| {
                let mut w = ArenaLayout::lay_out_window(key, requests);
                for (i, p) in w.requests.iter_mut().enumerate() {
                    match fixed.get(&(*instance, i)) {
                        Some(&at) => {
                            p.offset = Some(at);
                            p.permanent = true;
                        }
                        None => p.offset = p.offset.map(|o| o + offset),
                    }
                }
                w
            })
            .collect();
        ArenaLayout {
            windows,
            unstable: unstable.into_iter().collect(),
            permanent_bytes: offset,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_that_outlive_the_recording_are_permanent_and_later_freed_ones_left_out() {
        let mut r = Recorder::default();
        r.begin("init");
        r.on_alloc(10, 4096, Category::Parameter); // never freed: permanent
        r.on_alloc(11, 1024, Category::Temporary);
        r.on_free(11);
        r.begin("step");
        r.on_alloc(1, 1024, Category::Activation);
        r.on_alloc(2, 512, Category::OptimizerState); // never freed: permanent
        r.on_alloc(3, 2048, Category::Gradient); // outlives the window, freed in the next
        r.on_free(99); // allocated before any window: ignored
        r.on_free(1);
        r.begin("evaluation");
        r.on_free(3);
        r.end();
        let plan = r.finish();
        // Permanent: the parameter at 0, the state at 4096; windows above 4608.
        assert_eq!(plan.permanent_bytes, 4608);
        let init = plan.window("init").unwrap();
        assert_eq!(init.requests[0].offset, Some(0));
        assert!(init.requests[0].permanent);
        assert_eq!(init.requests[1].offset, Some(4608));
        let w = plan.window("step").unwrap();
        assert_eq!(w.requests[0].offset, Some(4608));
        assert_eq!(
            (w.requests[1].offset, w.requests[1].permanent),
            (Some(4096), true)
        );
        assert_eq!(
            (w.requests[2].offset, w.requests[2].permanent),
            (None, false)
        );
        assert_eq!((w.arena_bytes, w.peak_live), (1024, 1024));
        assert_eq!((plan.size(), plan.peak_live()), (4608 + 1024, 4608 + 1024));
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
