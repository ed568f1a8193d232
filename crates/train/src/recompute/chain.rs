//! The chain model of activation memory that checkpoint plans are judged by (Chen et al. 2016
//! §4.1, made to follow headroom's tape): a model is a chain of blocks; block i's input takes
//! `input[i]` bytes and, when the block runs without a checkpoint scope, its saved tensors take
//! `inner[i]` bytes more. A plan is a set of disjoint segments (runs of consecutive blocks); a
//! segment keeps only its first block's input during forward and recomputes its blocks in
//! backward, holding their inputs, inner bytes and the segment's output while it does. `head` is
//! what the layers after the chain hold at the end of forward (final norm, logits, loss); `extra`
//! is held throughout.
//!
//! Peak = max(everything stored at the end of forward + head,
//!            for each segment: what is stored before it + its blocks in full + its output)
//!        + extra.
//!
//! Not for: measuring the per-block sizes (the caller measures them on the allocator) or running.

use std::ops::Range;

/// Per-block activation sizes and costs of a chain.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    /// Bytes of each block's input (the previous block's output).
    pub input: Vec<u64>,
    /// Bytes each block saves for backward beyond its input.
    pub inner: Vec<u64>,
    /// Recompute cost of each block (e.g. its forward FLOPs; 1 per block counts blocks).
    pub cost: Vec<u64>,
    /// Bytes of the layers after the chain at the end of forward.
    pub head: u64,
    /// Bytes held throughout on top of the chain's activations.
    pub extra: u64,
}

/// A checkpoint plan: segments of blocks recomputed in backward, in order, disjoint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    pub segments: Vec<Range<usize>>,
}

/// What a plan costs under the chain model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanCost {
    pub peak_bytes: u64,
    /// Sum of the costs of recomputed blocks.
    pub recompute: u64,
}

impl Chain {
    /// A chain of `n` identical blocks.
    pub fn uniform(n: usize, input: u64, inner: u64, extra: u64) -> Chain {
        Chain {
            input: vec![input; n],
            inner: vec![inner; n],
            cost: vec![1; n],
            head: 0,
            extra,
        }
    }

    /// Bytes of block `i`'s output (the next block's input; the last block's output has the
    /// size of its input).
    pub fn output(&self, i: usize) -> u64 {
        self.input.get(i + 1).copied().unwrap_or(self.input[i])
    }

    pub fn len(&self) -> usize {
        self.input.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input.is_empty()
    }

    /// Bytes of blocks `r` when all their tensors are live (inputs and inner).
    pub fn full(&self, r: Range<usize>) -> u64 {
        r.map(|i| self.input[i] + self.inner[i]).sum()
    }

    /// Peak and recompute of `plan`.
    pub fn evaluate(&self, plan: &Plan) -> PlanCost {
        let mut stored = 0u64;
        let mut peak = 0u64;
        let mut recompute = 0u64;
        let mut next = 0usize;
        for seg in &plan.segments {
            stored += self.full(next..seg.start);
            peak = peak.max(stored + self.full(seg.clone()) + self.output(seg.end - 1));
            stored += self.input[seg.start];
            recompute += seg.clone().map(|i| self.cost[i]).sum::<u64>();
            next = seg.end;
        }
        stored += self.full(next..self.len());
        PlanCost {
            peak_bytes: peak.max(stored) + self.extra,
            recompute,
        }
    }
}

impl Plan {
    /// No recomputation.
    pub fn none() -> Plan {
        Plan::default()
    }

    /// One segment per block: every block recomputed, every block input kept.
    pub fn every_block(n: usize) -> Plan {
        Plan {
            segments: (0..n).map(|i| i..i + 1).collect(),
        }
    }

    /// Blocks 0, k, 2k, … each in a one-block segment.
    pub fn every_kth(n: usize, k: usize) -> Plan {
        Plan {
            segments: (0..n).step_by(k.max(1)).map(|i| i..i + 1).collect(),
        }
    }

    /// Chen et al.'s √n scheme: ⌈√n⌉ segments of (nearly) equal length covering the chain.
    pub fn sqrt(n: usize) -> Plan {
        if n == 0 {
            return Plan::none();
        }
        let k = (n as f64).sqrt().ceil() as usize;
        let len = n.div_ceil(k);
        Plan {
            segments: (0..n).step_by(len).map(|s| s..(s + len).min(n)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_chain_costs_match_the_formulas() {
        // 16 blocks, input a = 10, inner b = 90.
        let c = Chain::uniform(16, 10, 90, 0);
        // No recompute: everything stored, 16·100.
        assert_eq!(
            c.evaluate(&Plan::none()),
            PlanCost {
                peak_bytes: 1600,
                recompute: 0
            }
        );
        // Every block: 16 inputs stored; backward of the last block holds 15 inputs + its 100
        // + its recomputed output (10).
        assert_eq!(
            c.evaluate(&Plan::every_block(16)),
            PlanCost {
                peak_bytes: 15 * 10 + 100 + 10,
                recompute: 16
            }
        );
        // √16 = 4 segments of 4: forward stores 4 inputs (40); backward of the last segment holds
        // the 3 earlier inputs (30) + 4 blocks in full (400) + its output (10) = 440.
        assert_eq!(Plan::sqrt(16).segments.len(), 4);
        assert_eq!(
            c.evaluate(&Plan::sqrt(16)),
            PlanCost {
                peak_bytes: 440,
                recompute: 16
            }
        );
        // Every 2nd block: blocks 0, 2, … recomputed, 1, 3, … stored: forward end stores
        // 8·10 + 8·100 = 880.
        assert_eq!(c.evaluate(&Plan::every_kth(16, 2)).peak_bytes, 880);
    }

    #[test]
    fn sqrt_covers_the_chain_with_ceil_sqrt_segments() {
        for n in [1, 2, 3, 10, 17, 100, 1000] {
            let p = Plan::sqrt(n);
            assert_eq!(p.segments.first().unwrap().start, 0);
            assert_eq!(p.segments.last().unwrap().end, n);
            assert!(p.segments.windows(2).all(|w| w[0].end == w[1].start));
            assert!(p.segments.len() <= (n as f64).sqrt().ceil() as usize);
        }
    }
}
