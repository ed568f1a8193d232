//! A communicator as a tensor-parallel group: the tensor crate's linears sum their partials
//! over the ranks through [`ShardGroup`] (an all-gather, then a tree in rank order, so every
//! rank adds the same numbers in the same order), and this adapter runs that all-gather on any
//! [`Communicator`] — threads, MPI, or a dry run's shape-only rank, which counts it and moves
//! nothing.
//!
//! Not for: what is summed (the tensor crate's `ops::tensor_parallel`) or which weights are
//! split (the nn crate's modules).

use crate::{CollectiveCounts, Communicator};
use headroom_tensor::ShardGroup;
use std::sync::Mutex;

/// One rank's communicator, shared between the model's linears and the trainer (which gathers
/// the gradient norm and every rank's peaks over it).
pub struct TensorParallelGroup {
    rank: usize,
    world: usize,
    comm: Mutex<Box<dyn Communicator>>,
}

impl std::fmt::Debug for TensorParallelGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorParallelGroup")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

impl TensorParallelGroup {
    pub fn new(comm: Box<dyn Communicator>) -> TensorParallelGroup {
        TensorParallelGroup {
            rank: comm.rank(),
            world: comm.world_size(),
            comm: Mutex::new(comm),
        }
    }

    /// Runs `f` on the communicator (a rank calls collectives from one thread at a time).
    pub fn with_comm<R>(&self, f: impl FnOnce(&mut dyn Communicator) -> R) -> R {
        let mut comm = self.comm.lock().unwrap_or_else(|e| e.into_inner());
        f(comm.as_mut())
    }

    /// What this rank has communicated so far.
    pub fn counts(&self) -> CollectiveCounts {
        self.with_comm(|c| c.counts())
    }
}

impl ShardGroup for TensorParallelGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_gather(&self, part: &[f32]) -> Result<Vec<f32>, String> {
        let mut all = vec![0.0f32; part.len() * self.world];
        self.with_comm(|c| c.all_gather(part, &mut all))
            .map_err(|e| e.to_string())?;
        Ok(all)
    }

    fn all_gather_without_data(&self, elements: usize) -> Result<(), String> {
        self.with_comm(|c| c.without_data(crate::Collective::AllGather, elements))
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ShapeOnlyRank, ThreadGroup};
    use std::time::Duration;

    #[test]
    fn gathers_every_rank_in_rank_order_and_counts_a_dry_gather() {
        // Rank r sends [r, 10 + r]: every rank gets [0, 10, 1, 11, 2, 12].
        let ranks = ThreadGroup::ranks(3, Duration::from_secs(10));
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|r| {
                std::thread::spawn(move || {
                    let g = TensorParallelGroup::new(Box::new(r));
                    let me = g.rank() as f32;
                    g.all_gather(&[me, 10.0 + me]).unwrap()
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), vec![0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
        }
        let dry = TensorParallelGroup::new(Box::new(ShapeOnlyRank::new(1, 4)));
        dry.all_gather_without_data(5).unwrap();
        assert_eq!(dry.counts().all_gather, (1, 5));
    }
}
