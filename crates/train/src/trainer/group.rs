//! A trainer as one rank of a data-parallel group: what it communicated over a run, against
//! theory, and every rank's peaks gathered so that rank 0 can report them; the ZeRO stage a run
//! applies for its world size, and the group of one that ZeRO-3 parameter offload runs in alone.
//!
//! Not for: the collectives of a step (`step`, `zero`, `shard`).

use super::{TrainError, Trainer};
use crate::config::RunConfig;
use crate::report::{CommunicationReport, RANK_PEAKS_ELEMENTS, RankPeaks};
use headroom_comm::{CollectiveCounts, Communicator};
use headroom_strategy::ZeroStage;

impl Trainer {
    /// This rank's communication since `counted_from` (its counts and the step then), over
    /// the steps run since; `None` without a group.
    pub(super) fn communication_since(
        &self,
        counted_from: (CollectiveCounts, u64),
    ) -> Option<CommunicationReport> {
        let counts = self.collective_counts()?;
        let (rank_steps, world) = (self.step - counted_from.1, self.rank().1);
        let run_s: f64 = self
            .report
            .step_times_s
            .iter()
            .rev()
            .take(rank_steps as usize)
            .sum();
        Some(CommunicationReport::new(
            counts.since(&counted_from.0),
            rank_steps,
            run_s,
            self.model.num_params() as u64,
            self.zero_stage(),
            world,
        ))
    }

    /// Every rank's peaks and time in collectives, gathered into each rank's report (`ranks`);
    /// every rank of a group must call it, after `train`. One all-gather of 12 elements.
    pub fn gather_rank_peaks(&mut self) -> Result<&[RankPeaks], TrainError> {
        let stats = self.device.stats();
        let gather = |comm: &mut dyn Communicator| -> Result<Vec<f32>, TrainError> {
            let mine = RankPeaks {
                rank: comm.rank(),
                peak_allocated_bytes: stats.allocated_bytes.all.peak as u64,
                peak_reserved_bytes: stats.reserved_bytes.all.peak as u64,
                collective_ns: comm.counts().busy_ns,
            };
            let mut all = vec![0.0f32; RANK_PEAKS_ELEMENTS * comm.world_size()];
            comm.all_gather(&mine.encode(), &mut all)?;
            Ok(all)
        };
        // A split model's ranks gather over its group.
        let all = match (self.comm.as_mut(), &self.tensor_parallel) {
            (Some(comm), _) => gather(comm.as_mut())?,
            (None, Some(group)) => group.with_comm(gather)?,
            (None, None) => return Ok(&self.report.ranks),
        };
        self.report.ranks = all
            .chunks_exact(RANK_PEAKS_ELEMENTS)
            .enumerate()
            .map(|(rank, e)| RankPeaks::decode(rank, e))
            .collect();
        Ok(&self.report.ranks)
    }
}

/// The ZeRO stage a run of `world` ranks applies: the configured one in a group, 0 alone
/// (nothing to shard), except that offloading ZeRO-3 parameters runs stage 3 in a group of one.
pub(super) fn effective_stage(config: &RunConfig, world: usize) -> ZeroStage {
    let placement = config.strategy.placement;
    match world {
        1 if !placement.offload_params.is_offloaded() => ZeroStage::default(),
        _ => placement.zero_stage,
    }
}

/// A group of one rank: a thread group of size one, or for a dry run a shape-only rank.
pub(super) fn solo_rank(config: &RunConfig, dry: bool) -> Box<dyn Communicator> {
    match dry {
        true => Box::new(headroom_comm::ShapeOnlyRank::new(0, 1)),
        false => {
            let deadline = std::time::Duration::from_secs_f64(config.collective_timeout_s.max(1.0));
            let rank = headroom_comm::ThreadGroup::ranks(1, deadline)
                .pop()
                .expect("a group of one has one rank");
            Box::new(rank)
        }
    }
}
