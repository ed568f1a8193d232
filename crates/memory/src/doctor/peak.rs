//! The peak, attributed: the event where allocated bytes were highest, its phase and step, the
//! bytes alive then by category, and the largest live allocations collapsed by call site (the
//! innermost frame of the user's own code; library frames are looked through).
//!
//! Not for: fragmentation at the peak (see `fragmentation`), which needs a replay.

use super::events::{Events, Frame, Phase};
use super::lifetimes::Lifetime;
use super::phases::Timeline;
use crate::category::Category;
use serde::Serialize;
use std::collections::HashMap;

/// Whether a frame belongs to a library or the interpreter rather than the user's code.
pub fn is_library_frame(f: &Frame) -> bool {
    let path = f.filename.replace('\\', "/");
    path.is_empty()
        || path.starts_with('<')
        || path == "??"
        || path.contains("/site-packages/")
        || path.contains("/dist-packages/")
        || path.contains("/lib/python3")
        || path.starts_with("torch/")
        || path.contains("/torch/")
        || [".cpp", ".h", ".hpp", ".cu", ".cuh", ".c", ".cc"]
            .iter()
            .any(|ext| path.ends_with(ext))
}

/// The frame a stack is attributed to: its innermost user frame, else its innermost frame.
pub fn call_site(events: &Events, stack: u32) -> Option<u32> {
    let frames = &events.stacks[stack as usize];
    frames
        .iter()
        .copied()
        .find(|&f| !is_library_frame(&events.frames[f as usize]))
        .or_else(|| frames.first().copied())
}

/// Live allocations of one call site.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Site {
    /// The user's frame (`None`: no Python frame was recorded, as on autograd's threads).
    pub frame: Option<Frame>,
    /// The innermost frame of the largest allocation (the library op that made it).
    pub innermost: Option<Frame>,
    pub bytes: u64,
    pub count: u64,
    /// The category holding most of these bytes.
    pub category: Category,
}

/// The peak of allocated bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Peak {
    pub event_index: usize,
    pub allocated_bytes: u64,
    pub phase: Option<Phase>,
    pub step: u32,
    /// Bytes alive at the peak by category (every category, zeros included).
    pub by_category: Vec<(Category, u64)>,
    /// The largest call sites alive at the peak, largest first.
    pub sites: Vec<Site>,
}

/// Collapses the lifetimes selected by `alive` by call site, largest first.
pub fn sites<'a>(
    events: &Events,
    lifetimes: impl Iterator<Item = &'a Lifetime>,
    limit: usize,
) -> Vec<Site> {
    struct Acc {
        bytes: u64,
        count: u64,
        largest: (u64, u32),
        by_category: [u64; Category::COUNT],
    }
    let mut groups: HashMap<Option<u32>, Acc> = HashMap::new();
    for l in lifetimes {
        let acc = groups.entry(call_site(events, l.stack)).or_insert(Acc {
            bytes: 0,
            count: 0,
            largest: (0, 0),
            by_category: [0; Category::COUNT],
        });
        acc.bytes += l.size;
        acc.count += 1;
        acc.by_category[l.category.index()] += l.size;
        if l.size > acc.largest.0 {
            acc.largest = (l.size, l.stack);
        }
    }
    let mut out: Vec<Site> = groups
        .into_iter()
        .map(|(frame, acc)| {
            let category = Category::ALL
                .into_iter()
                .max_by_key(|c| acc.by_category[c.index()])
                .unwrap_or(Category::Other);
            Site {
                frame: frame.map(|f| events.frames[f as usize].clone()),
                innermost: events.stack(acc.largest.1).next().cloned(),
                bytes: acc.bytes,
                count: acc.count,
                category,
            }
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
    out.truncate(limit);
    out
}

/// The allocated-bytes curve: bytes allocated just after each event.
pub fn allocated_curve(events: &Events, lifetimes: &[Lifetime]) -> Vec<u64> {
    let mut delta = vec![0i64; events.events.len() + 1];
    for l in lifetimes {
        delta[l.alloc] += l.size as i64;
        if let Some(f) = l.free {
            delta[f] -= l.size as i64;
        }
    }
    let mut total = 0i64;
    delta[..events.events.len()]
        .iter()
        .map(|d| {
            total += d;
            total.max(0) as u64
        })
        .collect()
}

/// Finds and attributes the peak; `None` for a trace with no allocation.
pub fn peak(
    events: &Events,
    timeline: &Timeline,
    lifetimes: &[Lifetime],
    curve: &[u64],
    limit: usize,
) -> Option<Peak> {
    let (index, &bytes) = curve
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))?;
    if bytes == 0 {
        return None;
    }
    let mut by_category = [0u64; Category::COUNT];
    for l in lifetimes.iter().filter(|l| l.alive_after(index)) {
        by_category[l.category.index()] += l.size;
    }
    Some(Peak {
        event_index: index,
        allocated_bytes: bytes,
        phase: timeline.phases[index],
        step: timeline.steps[index],
        by_category: Category::ALL
            .into_iter()
            .map(|c| (c, by_category[c.index()]))
            .collect(),
        sites: sites(
            events,
            lifetimes.iter().filter(|l| l.alive_after(index)),
            limit,
        ),
    })
}
