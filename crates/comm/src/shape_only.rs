//! `ShapeOnlyRank`: one rank of a group whose collectives move nothing and wait for no one.
//! A dry run (the trainer on a shape-only device) uses it to make the allocations a rank of
//! the group makes — its shard of the optimizer state, its gathers — without the other ranks.
//! Inside a counted scope (`headroom_tensor::backend::work::count_work`) each collective adds
//! the elements it would send on a ring to the counted work, which the speed model times.
//!
//! Not for: real runs (their values would be wrong: buffers are left as they are).

use crate::communicator::{Collective, CollectiveCounts, CommError, Communicator};

/// A stand-in for rank `rank` of `world`.
#[derive(Debug)]
pub struct ShapeOnlyRank {
    rank: usize,
    world: usize,
    counts: CollectiveCounts,
}

impl ShapeOnlyRank {
    pub fn new(rank: usize, world: usize) -> ShapeOnlyRank {
        ShapeOnlyRank {
            rank,
            world,
            counts: CollectiveCounts::default(),
        }
    }

    /// Counts a collective of `elements` and adds it to the counted work.
    fn join(&mut self, kind: Collective, elements: usize) {
        self.counts.record(kind, elements);
        headroom_tensor::backend::work::collective(kind.ring_elements(elements as u64, self.world));
    }
}

impl Communicator for ShapeOnlyRank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CommError> {
        self.join(Collective::AllReduce, data.len());
        Ok(())
    }
    fn reduce_scatter_sum(&mut self, input: &[f32], _: &mut [f32]) -> Result<(), CommError> {
        self.join(Collective::ReduceScatter, input.len());
        Ok(())
    }
    fn all_gather(&mut self, input: &[f32], _: &mut [f32]) -> Result<(), CommError> {
        self.join(Collective::AllGather, input.len());
        Ok(())
    }
    fn broadcast(&mut self, data: &mut [f32], _: usize) -> Result<(), CommError> {
        self.join(Collective::Broadcast, data.len());
        Ok(())
    }
    fn barrier(&mut self) -> Result<(), CommError> {
        self.join(Collective::Barrier, 0);
        Ok(())
    }
    fn without_data(&mut self, kind: Collective, elements: usize) -> Result<(), CommError> {
        self.join(kind, elements);
        Ok(())
    }
    fn fail(&mut self, _: &str) {}
    fn counts(&self) -> CollectiveCounts {
        self.counts
    }
}
