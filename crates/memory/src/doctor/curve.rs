//! The live bytes by category over a trace, sampled for a picture: the events are cut into at
//! most `points` equal runs and each run is shown by its event with the most bytes allocated
//! (so the peak is always drawn), with the bytes alive after it per category.
//!
//! Not for: the peak's attribution (see `peak`), which looks at one event in full.

use super::lifetimes::Lifetime;
use crate::category::Category;
use serde::Serialize;

/// The bytes alive just after one event, by category (in `Category::ALL` order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Sample {
    pub event_index: usize,
    pub by_category: [u64; Category::COUNT],
}

/// Samples `curve` (bytes allocated after each event) at no more than `points` events.
pub fn sample(lifetimes: &[Lifetime], curve: &[u64], points: usize) -> Vec<Sample> {
    if curve.is_empty() || points == 0 {
        return Vec::new();
    }
    let run = curve.len().div_ceil(points);
    let picks: Vec<usize> = (0..curve.len())
        .step_by(run)
        .map(|start| {
            let end = (start + run).min(curve.len());
            (start..end)
                .max_by(|&a, &b| curve[a].cmp(&curve[b]).then(b.cmp(&a)))
                .unwrap_or(start)
        })
        .collect();
    // Every allocation's start and end as (event, category, ±bytes), swept in event order.
    let mut changes: Vec<(usize, u8, i64)> = Vec::with_capacity(lifetimes.len() * 2);
    for l in lifetimes {
        let c = l.category.index() as u8;
        changes.push((l.alloc, c, l.size as i64));
        if let Some(f) = l.free {
            changes.push((f, c, -(l.size as i64)));
        }
    }
    changes.sort_unstable_by_key(|c| c.0);
    let mut live = [0i64; Category::COUNT];
    let mut next = 0;
    picks
        .into_iter()
        .map(|at| {
            while next < changes.len() && changes[next].0 <= at {
                let (_, c, d) = changes[next];
                live[c as usize] += d;
                next += 1;
            }
            Sample {
                event_index: at,
                by_category: live.map(|b| b.max(0) as u64),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(alloc: usize, free: Option<usize>, size: u64, category: Category) -> Lifetime {
        Lifetime {
            alloc,
            free,
            size,
            stack: 0,
            category,
            stated: true,
        }
    }

    #[test]
    fn each_run_is_shown_by_its_highest_event_with_its_bytes_by_category() {
        // A 100-byte parameter from event 0; a 50-byte activation alive after events 1..=2
        // (freed at 3); a 30-byte temporary alive after event 4 only (freed at 5).
        let l = [
            life(0, None, 100, Category::Parameter),
            life(1, Some(3), 50, Category::Activation),
            life(4, Some(5), 30, Category::Temporary),
        ];
        let curve = [100, 150, 150, 100, 130, 100];
        let s = sample(&l, &curve, 2);
        // Runs [0, 3) and [3, 6): the first peaks at event 1 (the earliest of the ties), the
        // second at event 4.
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].event_index, 1);
        assert_eq!(s[0].by_category[Category::Parameter.index()], 100);
        assert_eq!(s[0].by_category[Category::Activation.index()], 50);
        assert_eq!(s[1].event_index, 4);
        assert_eq!(s[1].by_category[Category::Activation.index()], 0);
        assert_eq!(s[1].by_category[Category::Temporary.index()], 30);
        assert_eq!(s[1].by_category.iter().sum::<u64>(), 130);
    }
}
