//! Communicators: the collective operations data parallelism and ZeRO are built from
//! (all-reduce, reduce-scatter, all-gather, broadcast, barrier) behind one trait, so the
//! engine never assumes a transport. `ThreadGroup` runs N ranks as threads of one process
//! (tests, one-node runs); MPI and NCCL are further implementations of the same trait.
//!
//! Every collective reduces in a canonical order (rank 0, 1, …, N − 1, in f32), so every rank
//! gets bitwise the same result whatever the threads' timing; every wait has a deadline, after
//! which the collective fails naming the ranks that never arrived; ranks that call different
//! collectives get an error, not a hang; a rank that fails (or panics) releases the others
//! at once. Each rank counts its collectives and the elements it sent.
//!
//! `TensorParallelGroup` lends a communicator to the tensor crate's tensor-parallel linears.
//!
//! Not for: what is communicated (DDP buckets, ZeRO shards: the engine) or where buffers live
//! (the caller's device allocator, tagged `communication`).

mod communicator;
#[cfg(feature = "mpi")]
mod mpi_plain;
#[cfg(feature = "mpi")]
mod mpi_rank;
mod shape_only;
mod tensor_parallel;
mod thread_group;

pub use communicator::{Collective, CollectiveCounts, CommError, Communicator};
#[cfg(feature = "mpi")]
pub use mpi_rank::{MpiRank, launched_by_mpirun};
pub use shape_only::ShapeOnlyRank;
pub use tensor_parallel::TensorParallelGroup;
pub use thread_group::{ThreadGroup, ThreadRank};
