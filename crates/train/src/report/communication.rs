//! What a data-parallel run communicated, set against theory: the collectives one rank joined
//! over the run (calls and elements per kind), the elements it sends per optimizer step if each
//! collective runs as a ring, the ZeRO paper's volume for the stage, and the time spent inside
//! collectives; and each rank's peaks, gathered so that rank 0 can report every rank.
//!
//! Not for: counting (the communicator counts) or moving bytes (the trainer gathers the peaks).

use headroom_comm::CollectiveCounts;
use headroom_strategy::ZeroStage;
use serde::Serialize;

/// One rank's communication over a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CommunicationReport {
    pub world_size: usize,
    pub zero_stage: ZeroStage,
    /// Optimizer steps the counts cover.
    pub steps: u64,
    /// Every collective of the training loop: gradients, parameters, and the bookkeeping
    /// (the stop vote, the losses, the gradient norm's partial sums, validation's gathers).
    pub counts: CollectiveCounts,
    /// Elements this rank sends per optimizer step if every collective runs as a ring
    /// (`CollectiveCounts::ring_elements`), measured from `counts`.
    pub sent_elements_per_step: f64,
    /// The same for the model states alone by the ZeRO paper (Rajbhandari et al. 2020, §7):
    /// 2Ψ(N−1)/N for DDP, ZeRO-1 and ZeRO-2 (a reduce-scatter and an all-gather, or an
    /// all-reduce, of Ψ), 3Ψ(N−1)/N for ZeRO-3 (parameters gathered for forward and backward).
    pub theory_elements_per_step: f64,
    /// `sent_elements_per_step` × 4 bytes (every collective moves f32).
    pub sent_bytes_per_step: f64,
    /// Seconds inside collectives, waiting for the other ranks included.
    pub collective_s: f64,
    /// `collective_s` over the run's step time.
    pub collective_fraction: f64,
}

impl CommunicationReport {
    /// The report of `counts` (since the run began) over `steps` steps taking `step_s` seconds
    /// in all, for a model of `parameters` at `zero_stage` on `world_size` ranks.
    pub fn new(
        counts: CollectiveCounts,
        steps: u64,
        step_s: f64,
        parameters: u64,
        zero_stage: ZeroStage,
        world_size: usize,
    ) -> CommunicationReport {
        let per_step = |x: f64| if steps > 0 { x / steps as f64 } else { 0.0 };
        let sent = per_step(counts.ring_elements(world_size));
        CommunicationReport {
            world_size,
            zero_stage,
            steps,
            counts,
            sent_elements_per_step: sent,
            theory_elements_per_step: theory_elements(parameters, zero_stage, world_size),
            sent_bytes_per_step: 4.0 * sent,
            collective_s: counts.busy_s(),
            collective_fraction: if step_s > 0.0 {
                counts.busy_s() / step_s
            } else {
                0.0
            },
        }
    }
}

/// Elements one rank sends per step for the model states of `parameters` at `zero_stage` on a
/// ring of `world` ranks, by the ZeRO paper: 2Ψ(N−1)/N, or 3Ψ(N−1)/N at stage 3.
pub fn theory_elements(parameters: u64, zero_stage: ZeroStage, world: usize) -> f64 {
    let n = world.max(1) as f64;
    let passes = if zero_stage.shards_parameters() {
        3.0
    } else {
        2.0
    };
    passes * parameters as f64 * (n - 1.0) / n
}

/// One rank's peaks and time in collectives, as rank 0 reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RankPeaks {
    pub rank: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Nanoseconds inside collectives.
    pub collective_ns: u64,
}

/// Fields of `RankPeaks` sent per rank, each a u64 as four 16-bit pieces (exact in f32).
const PIECES: usize = 4;
pub(crate) const RANK_PEAKS_ELEMENTS: usize = 3 * PIECES;

impl RankPeaks {
    /// This rank's values as f32 elements of an all-gather, exactly.
    pub(crate) fn encode(&self) -> Vec<f32> {
        [
            self.peak_allocated_bytes,
            self.peak_reserved_bytes,
            self.collective_ns,
        ]
        .iter()
        .flat_map(|&v| (0..PIECES).map(move |i| ((v >> (16 * i)) & 0xffff) as f32))
        .collect()
    }

    /// Rank `rank`'s values from its `RANK_PEAKS_ELEMENTS` gathered elements.
    pub(crate) fn decode(rank: usize, elements: &[f32]) -> RankPeaks {
        let value = |field: usize| {
            (0..PIECES).fold(0u64, |v, i| {
                v | ((elements[field * PIECES + i] as u64) << (16 * i))
            })
        };
        RankPeaks {
            rank,
            peak_allocated_bytes: value(0),
            peak_reserved_bytes: value(1),
            collective_ns: value(2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_cross_the_gather_exactly() {
        let p = RankPeaks {
            rank: 3,
            peak_allocated_bytes: u64::MAX - 12_345,
            peak_reserved_bytes: (1 << 40) + 7,
            collective_ns: 0,
        };
        let e = p.encode();
        assert_eq!(e.len(), RANK_PEAKS_ELEMENTS);
        assert!(
            e.iter()
                .all(|&x| x.fract() == 0.0 && (0.0..65_536.0).contains(&x))
        );
        assert_eq!(RankPeaks::decode(3, &e), p);
    }

    #[test]
    fn theory_is_the_zero_papers_volume() {
        // 1,000 parameters on 4 ranks: DDP/ZeRO-1/ZeRO-2 send 2 · 1000 · 3/4 = 1500 elements,
        // ZeRO-3 3 · 1000 · 3/4 = 2250; one rank sends nothing.
        assert_eq!(theory_elements(1000, ZeroStage::new(0).unwrap(), 4), 1500.0);
        assert_eq!(theory_elements(1000, ZeroStage::new(2).unwrap(), 4), 1500.0);
        assert_eq!(theory_elements(1000, ZeroStage::new(3).unwrap(), 4), 2250.0);
        assert_eq!(theory_elements(1000, ZeroStage::new(3).unwrap(), 1), 0.0);
    }
}
