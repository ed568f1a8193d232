//! Chen et al. 2016's budgeted planner (Algorithm 3) with the search over its budget B from
//! Appendix A, on a chain of blocks: the baseline the exact dynamic program is measured against.
//!
//! Not for: the exact optimum (see `optimal`).

use super::chain::{Chain, Plan, PlanCost};

/// Algorithm 3 with every block boundary as a candidate split: accumulate block bytes; when the
/// running total exceeds `b` at a boundary, keep that boundary (start a new segment). Returns the
/// plan, x (bytes of kept boundaries) and y (the largest segment's bytes).
pub fn greedy(chain: &Chain, b: u64) -> (Plan, u64, u64) {
    let n = chain.len();
    let (mut temp, mut x, mut y) = (0u64, 0u64, 0u64);
    let mut segments = Vec::new();
    let mut start = 0;
    for i in 0..n {
        temp += chain.input[i] + chain.inner[i];
        let boundary = chain.input.get(i + 1).copied().unwrap_or(0);
        if i + 1 < n && temp > b {
            x += boundary;
            y = y.max(temp);
            segments.push(start..i + 1);
            start = i + 1;
            temp = 0;
        }
    }
    y = y.max(temp);
    if start < n {
        segments.push(start..n);
    }
    (Plan { segments }, x, y)
}

/// One candidate of the search, with its budget parameter and exact cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub b: u64,
    pub plan: Plan,
    pub cost: PlanCost,
}

/// Appendix A: B = 0, then B = √(x·y), then a 6-point grid over [B/2, 2B]; every plan is
/// evaluated exactly.
pub fn budget_candidates(chain: &Chain) -> Vec<Candidate> {
    let eval = |b: u64| {
        let (plan, x, y) = greedy(chain, b);
        let cost = chain.evaluate(&plan);
        (Candidate { b, plan, cost }, x, y)
    };
    let (first, x, y) = eval(0);
    let seed = ((x as f64) * (y as f64)).sqrt() as u64;
    let mut out = vec![first, eval(seed).0];
    for i in 0..6 {
        let b = seed / 2 + (seed as f64 * 1.5 * i as f64 / 5.0) as u64;
        out.push(eval(b).0);
    }
    out
}

/// The baseline answer for a memory budget: among the searched plans that fit, the one that
/// recomputes least (then the lowest peak); `None` if none fits.
pub fn best_within(chain: &Chain, budget: u64) -> Option<Candidate> {
    budget_candidates(chain)
        .into_iter()
        .filter(|c| c.cost.peak_bytes <= budget)
        .min_by_key(|c| (c.cost.recompute, c.cost.peak_bytes))
}

/// Chen's own objective: the searched plan with the lowest exact peak.
pub fn lowest_peak(chain: &Chain) -> Candidate {
    budget_candidates(chain)
        .into_iter()
        .min_by_key(|c| (c.cost.peak_bytes, c.cost.recompute))
        .expect("budget_candidates returns plans")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_zero_keeps_every_boundary_and_a_large_budget_keeps_none() {
        let c = Chain::uniform(8, 10, 90, 0);
        let (plan, x, y) = greedy(&c, 0);
        assert_eq!(plan, Plan::every_block(8));
        // 7 kept boundaries of 10 bytes; every segment is one block of 100 bytes.
        assert_eq!((x, y), (70, 100));
        let (plan, x, _) = greedy(&c, 10_000);
        assert_eq!(plan.segments, vec![0..8]);
        assert_eq!(x, 0);
    }

    #[test]
    fn the_sqrt_xy_seed_gives_about_sqrt_n_segments_on_a_uniform_chain() {
        // n = 100, a = 10, b = 90: B = 0 gives x = 99·10, y = 100, seed √(990·100) ≈ 314 →
        // segments close when the running total passes 314, i.e. every 4 blocks: 25 segments.
        let c = Chain::uniform(100, 10, 90, 0);
        let cands = budget_candidates(&c);
        assert_eq!(cands[1].plan.segments.len(), 25);
        let best = lowest_peak(&c);
        // √n segments of √n blocks: 9 earlier inputs (90) + 10 blocks in full (1000) + an
        // output (10) = 1100 at best; the search keeps the best of its candidates.
        assert!(best.cost.peak_bytes <= cands[1].cost.peak_bytes);
        assert!(best.cost.peak_bytes < 1600);
    }
}
