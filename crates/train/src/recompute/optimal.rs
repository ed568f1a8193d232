//! The exact plan for a memory budget: a dynamic program over the chain that finds, among all
//! ways to cut the chain into plain blocks and recomputed segments, the one with the least
//! recomputation whose peak (the chain model's) fits the budget; ties go to the lower peak.
//! States at each block boundary are Pareto fronts of (bytes stored so far, recompute so far);
//! a dominated state can never lead to a better plan, so it is dropped. With unit costs a front
//! has at most n + 1 states, so the program is O(n² · L) for segments of at most L blocks.
//!
//! Not for: the greedy baseline (see `chen`).

use super::chain::{Chain, Plan, PlanCost};

#[derive(Debug, Clone, Copy)]
struct State {
    stored: u64,
    recompute: u64,
    /// Highest peak reached so far by a segment's backward.
    seg_peak: u64,
    /// Where this state came from: (position, index in that position's front, segment start or
    /// `usize::MAX` for a plain block).
    from: (usize, usize, usize),
}

/// The least-recompute plan whose peak is at most `budget`, or `None` if even recomputing
/// everything does not fit.
pub fn optimal_plan(chain: &Chain, budget: u64) -> Option<(Plan, PlanCost)> {
    let n = chain.len();
    let limit = budget.checked_sub(chain.extra)?;
    let mut fronts: Vec<Vec<State>> = vec![Vec::new(); n + 1];
    fronts[0].push(State {
        stored: 0,
        recompute: 0,
        seg_peak: 0,
        from: (0, 0, 0),
    });
    // Prefix sums of full bytes and costs.
    let mut full = vec![0u64; n + 1];
    let mut cost = vec![0u64; n + 1];
    for i in 0..n {
        full[i + 1] = full[i] + chain.input[i] + chain.inner[i];
        cost[i + 1] = cost[i] + chain.cost[i];
    }
    // A state at the end of the chain must also hold the head at the end of forward.
    let tail_head = |pos: usize| if pos == n { chain.head } else { 0 };
    for j in 0..n {
        let front = std::mem::take(&mut fronts[j]);
        for (idx, s) in front.iter().enumerate() {
            // Plain block j.
            let stored = s.stored + full[j + 1] - full[j];
            if stored + tail_head(j + 1) <= limit {
                fronts[j + 1].push(State {
                    stored,
                    recompute: s.recompute,
                    seg_peak: s.seg_peak,
                    from: (j, idx, usize::MAX),
                });
            }
            // Segment [j, k).
            for k in j + 1..=n {
                let during = s.stored + full[k] - full[j] + chain.output(k - 1);
                if during > limit {
                    break;
                }
                if k == n && s.stored + chain.input[j] + chain.head > limit {
                    continue;
                }
                fronts[k].push(State {
                    stored: s.stored + chain.input[j],
                    recompute: s.recompute + cost[k] - cost[j],
                    seg_peak: s.seg_peak.max(during),
                    from: (j, idx, j),
                });
            }
        }
        fronts[j] = front;
        prune(&mut fronts[j + 1]);
    }
    let best = fronts[n]
        .iter()
        .enumerate()
        .min_by_key(|(_, s)| (s.recompute, s.stored.max(s.seg_peak)))
        .map(|(i, _)| i)?;
    // Walk back.
    let mut segments = Vec::new();
    let (mut pos, mut idx) = (n, best);
    while pos > 0 {
        let s = fronts[pos][idx];
        let (prev, prev_idx, seg_start) = s.from;
        if seg_start != usize::MAX {
            segments.push(seg_start..pos);
        }
        pos = prev;
        idx = prev_idx;
    }
    segments.reverse();
    let plan = Plan { segments };
    let cost = chain.evaluate(&plan);
    Some((plan, cost))
}

/// Keeps the Pareto front over (recompute, stored): a state that stores at least as much as one
/// with less or equal recompute can never finish better (the segment-peak constraint is checked
/// on every transition, so it needs no place in the state; it only breaks final ties).
fn prune(front: &mut Vec<State>) {
    front.sort_by_key(|s| (s.recompute, s.stored, s.seg_peak));
    let mut kept: Vec<State> = Vec::with_capacity(front.len());
    let mut best_stored = u64::MAX;
    for s in front.drain(..) {
        if s.stored < best_stored {
            best_stored = s.stored;
            kept.push(s);
        }
    }
    *front = kept;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recompute::chen;

    #[test]
    fn a_budget_that_fits_everything_recomputes_nothing() {
        let c = Chain::uniform(10, 10, 90, 5);
        let (plan, cost) = optimal_plan(&c, 1005).unwrap();
        assert!(plan.segments.is_empty());
        assert_eq!(
            cost,
            PlanCost {
                peak_bytes: 1005,
                recompute: 0
            }
        );
        assert!(
            optimal_plan(&c, 50).is_none(),
            "below one block in full nothing fits"
        );
    }

    #[test]
    fn one_block_over_budget_recomputes_exactly_one_block() {
        // 10 blocks of 100 in full: 1000 stored. With 950, checkpointing the first block saves
        // 90 (stores 10 instead of 100): stored 910, and its recompute peak is 110 — fits.
        let c = Chain::uniform(10, 10, 90, 0);
        let (plan, cost) = optimal_plan(&c, 950).unwrap();
        assert_eq!(cost.recompute, 1);
        assert!(cost.peak_bytes <= 950);
        assert_eq!(plan.segments.len(), 1);
    }

    #[test]
    fn never_worse_than_sqrt_or_chen_when_they_fit() {
        for (n, a, b) in [
            (16usize, 10u64, 90u64),
            (64, 4, 60),
            (100, 10, 90),
            (256, 8, 40),
        ] {
            let c = Chain::uniform(n, a, b, 7);
            let sqrt = c.evaluate(&Plan::sqrt(n));
            let (_, opt) = optimal_plan(&c, sqrt.peak_bytes).unwrap();
            assert!(opt.peak_bytes <= sqrt.peak_bytes);
            assert!(
                opt.recompute <= sqrt.recompute,
                "n={n}: {opt:?} vs sqrt {sqrt:?}"
            );
            for budget in [
                sqrt.peak_bytes,
                sqrt.peak_bytes * 3 / 2,
                c.evaluate(&Plan::none()).peak_bytes - 1,
            ] {
                if let Some(base) = chen::best_within(&c, budget) {
                    let (_, opt) = optimal_plan(&c, budget).unwrap();
                    assert!(opt.recompute <= base.cost.recompute && opt.peak_bytes <= budget);
                }
            }
        }
    }

    #[test]
    fn heterogeneous_chains_keep_cheap_big_blocks_out_of_segments_only_when_needed() {
        // Block 1 is huge: only recomputing it (or a segment starting at it) fits 300.
        let c = Chain {
            input: vec![10, 10, 10],
            inner: vec![20, 400, 20],
            cost: vec![1, 1, 1],
            head: 0,
            extra: 0,
        };
        let (plan, cost) = optimal_plan(&c, 450).unwrap();
        assert!(cost.peak_bytes <= 450);
        assert!(plan.segments.iter().any(|s| s.contains(&1)), "{plan:?}");
        assert_eq!(cost.recompute, 1);
    }
}
