//! `ShapeOnlyRank`: one rank of a group whose collectives move nothing and wait for no one.
//! A dry run (the trainer on a shape-only device) uses it to make the allocations a rank of
//! the group makes — its shard of the optimizer state, its gathers — without the other ranks.
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
}

impl Communicator for ShapeOnlyRank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CommError> {
        self.counts.record(Collective::AllReduce, data.len());
        Ok(())
    }
    fn reduce_scatter_sum(&mut self, input: &[f32], _: &mut [f32]) -> Result<(), CommError> {
        self.counts.record(Collective::ReduceScatter, input.len());
        Ok(())
    }
    fn all_gather(&mut self, input: &[f32], _: &mut [f32]) -> Result<(), CommError> {
        self.counts.record(Collective::AllGather, input.len());
        Ok(())
    }
    fn broadcast(&mut self, data: &mut [f32], _: usize) -> Result<(), CommError> {
        self.counts.record(Collective::Broadcast, data.len());
        Ok(())
    }
    fn barrier(&mut self) -> Result<(), CommError> {
        self.counts.record(Collective::Barrier, 0);
        Ok(())
    }
    fn fail(&mut self, _: &str) {}
    fn counts(&self) -> CollectiveCounts {
        self.counts
    }
}
