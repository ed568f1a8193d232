//! Offsets for allocations whose lifetimes are known in advance: the dynamic storage allocation
//! problem (NP-hard in general), solved with the "greedy by size" heuristic of Pisarchyk & Lee,
//! *Efficient Memory Management for Deep Neural Net Inference* (arXiv:2001.03288, 2020) —
//! largest first, each placed in the smallest gap left by the already placed allocations whose
//! lifetimes overlap its own, or above them all — with two more orders tried beside it. The
//! lower bound any packing meets is the peak of live bytes over time; it is not always
//! reachable (interleaved lifetimes of mixed sizes leave gaps no order closes).
//!
//! Not for: serving requests (see `allocator::planned`) or recording lifetimes (see `plan`).

/// One allocation's size and lifetime: live from event `start` until event `end` (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub size: u64,
    pub start: usize,
    pub end: usize,
}

impl Interval {
    fn overlaps(&self, other: &Interval) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The peak over time of the summed sizes of the live intervals: no packing needs less.
pub fn peak_live(intervals: &[Interval]) -> u64 {
    let mut changes: Vec<(usize, i128)> = Vec::with_capacity(2 * intervals.len());
    for i in intervals {
        changes.push((i.start, i.size as i128));
        changes.push((i.end, -(i.size as i128)));
    }
    // At one instant, frees come before allocations (an interval ending at t is gone at t).
    changes.sort_by_key(|&(t, delta)| (t, delta > 0));
    let (mut live, mut peak) = (0i128, 0i128);
    for (_, delta) in changes {
        live += delta;
        peak = peak.max(live);
    }
    peak as u64
}

/// Offsets (in the order of `intervals`) such that no two intervals live at the same time
/// share a byte, and the arena size they need (the largest `offset + size`). Three greedy
/// orders are tried — largest first (Pisarchyk & Lee's greedy by size), longest-lived first,
/// and largest size × lifetime first — each placing every interval best-fit, and the smallest
/// arena wins (ties to the earlier order): training steps, whose lifetimes nest like a stack,
/// pack to the bound under any of them; interleaved lifetimes favour different orders.
pub fn pack(intervals: &[Interval]) -> (Vec<u64>, u64) {
    let life = |v: &Interval| (v.end - v.start) as u128;
    let keys: [&dyn Fn(&Interval) -> u128; 3] = [&|v| v.size as u128, &|v| life(v), &|v| {
        v.size as u128 * life(v)
    }];
    let mut best: Option<(Vec<u64>, u64)> = None;
    for key in keys {
        let mut order: Vec<usize> = (0..intervals.len()).collect();
        // Descending key; ties by size, then lifetime, then start: deterministic.
        order.sort_by_key(|&i| {
            let v = &intervals[i];
            (std::cmp::Reverse((key(v), v.size, life(v))), v.start)
        });
        let packed = place(intervals, &order);
        if best.as_ref().is_none_or(|b| packed.1 < b.1) {
            best = Some(packed);
        }
    }
    best.unwrap_or_default()
}

/// Places the intervals in `order`, each in the smallest gap left by the already placed ones
/// whose lifetimes overlap its own, or above them all.
fn place(intervals: &[Interval], order: &[usize]) -> (Vec<u64>, u64) {
    let mut offsets = vec![0u64; intervals.len()];
    // Placed intervals sorted by offset.
    let mut placed: Vec<(u64, usize)> = Vec::with_capacity(intervals.len());
    let mut arena = 0u64;
    for &i in order {
        let me = intervals[i];
        let (mut best, mut best_gap) = (None, u64::MAX);
        let mut low = 0u64; // lowest free offset above the overlapping intervals seen so far
        for &(offset, j) in &placed {
            let other = intervals[j];
            if !me.overlaps(&other) {
                continue;
            }
            if offset > low {
                let gap = offset - low;
                if gap >= me.size && gap < best_gap {
                    (best, best_gap) = (Some(low), gap);
                }
            }
            low = low.max(offset + other.size);
        }
        let offset = best.unwrap_or(low);
        offsets[i] = offset;
        arena = arena.max(offset + me.size);
        let at = placed.partition_point(|&(o, _)| o <= offset);
        placed.insert(at, (offset, i));
    }
    (offsets, arena)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(size: u64, start: usize, end: usize) -> Interval {
        Interval { size, start, end }
    }

    /// No two intervals that overlap in time overlap in space.
    fn assert_disjoint(intervals: &[Interval], offsets: &[u64]) {
        for a in 0..intervals.len() {
            for b in a + 1..intervals.len() {
                if intervals[a].overlaps(&intervals[b]) {
                    let (oa, ob) = (offsets[a], offsets[b]);
                    assert!(
                        oa + intervals[a].size <= ob || ob + intervals[b].size <= oa,
                        "{a} and {b} collide"
                    );
                }
            }
        }
    }

    #[test]
    fn sequential_lifetimes_share_one_slot() {
        // Each allocation dies before the next is made: one slot of the largest size.
        let v = [iv(100, 0, 1), iv(300, 1, 2), iv(200, 2, 3)];
        let (offsets, size) = pack(&v);
        assert_eq!(offsets, vec![0, 0, 0]);
        assert_eq!(size, 300);
        assert_eq!(peak_live(&v), 300);
    }

    #[test]
    fn interleaved_lifetimes_meet_the_bound() {
        // A stack-like forward/backward: a (4) and b (2) live together, b dies, c (2) comes,
        // then a dies and d (4) lives with c. Peak live 6 at every moment; greedy reaches it.
        let v = [iv(4, 0, 4), iv(2, 1, 2), iv(2, 3, 6), iv(4, 5, 7)];
        let (offsets, size) = pack(&v);
        assert_disjoint(&v, &offsets);
        assert_eq!(peak_live(&v), 6);
        assert_eq!(size, 6);
    }

    #[test]
    fn random_lifetimes_are_disjoint_and_above_the_bound() {
        // A small linear congruential generator: reproducible without a dependency.
        let mut state = 12345u64;
        let mut next = |m: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        let v: Vec<Interval> = (0..300)
            .map(|_| {
                let start = next(1000) as usize;
                let len = 1 + next(100) as usize;
                iv(512 * (1 + next(64)), start, start + len)
            })
            .collect();
        let (offsets, size) = pack(&v);
        assert_disjoint(&v, &offsets);
        let bound = peak_live(&v);
        assert!(size >= bound);
        // Greedy by size stays close to the bound on such inputs (the paper: within a few %).
        assert!(
            size as f64 <= 1.25 * bound as f64,
            "{size} vs bound {bound}"
        );
    }

    #[test]
    fn frees_at_an_instant_come_before_allocations() {
        assert_eq!(peak_live(&[iv(10, 0, 5), iv(10, 5, 9)]), 10);
        assert_eq!(pack(&[iv(10, 0, 5), iv(10, 5, 9)]).1, 10);
    }
}
