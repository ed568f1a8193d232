//! MPI's own collectives on an `MpiRank`'s world, for benchmarks only: `headroom bench
//! collectives` sets the rank's collectives (rank-order sums over gathered contributions, with
//! the agreement that turns mismatches into errors) against plain `MPI_Allreduce`,
//! `MPI_Reduce_scatter_block` and `MPI_Allgather` on the same buffers.
//!
//! Not for: training (MPI's reduction order is the library's choice, so results are not
//! bitwise the same on every rank count; nothing here is counted, agreed or watched).

use crate::mpi_rank::MpiRank;
use mpi::collective::SystemOperation;
use mpi::traits::CommunicatorCollectives as _;

impl MpiRank {
    /// `MPI_Allreduce` (sum): `output` becomes the sum over ranks of `input`.
    pub fn plain_all_reduce_sum(&mut self, input: &[f32], output: &mut [f32]) {
        self.world()
            .all_reduce_into(input, output, SystemOperation::sum());
    }

    /// `MPI_Reduce_scatter_block` (sum): rank r's `output` is the sum of chunk r of `input`.
    pub fn plain_reduce_scatter_sum(&mut self, input: &[f32], output: &mut [f32]) {
        self.world()
            .reduce_scatter_block_into(input, output, SystemOperation::sum());
    }

    /// `MPI_Allgather` of `input` into `output`.
    pub fn plain_all_gather(&mut self, input: &[f32], output: &mut [f32]) {
        self.world().all_gather_into(input, output);
    }

    /// `MPI_Barrier`.
    pub fn plain_barrier(&mut self) {
        self.world().barrier();
    }
}
