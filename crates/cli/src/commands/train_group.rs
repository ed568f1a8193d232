//! Which rank of an `mpirun` job this `headroom train` process is (the `mpi` build), refusing a
//! `--data-parallel` or `--tensor-parallel` that disagrees with the job's size.
//!
//! Not for: running the ranks (`headroom_train::launch`).

use headroom_train::comm::Communicator;
use headroom_train::config::TrainConfig;

/// This process's rank when `mpirun` started it (the `mpi` build); refuses a --data-parallel
/// that disagrees with the job's size.
#[cfg(feature = "mpi")]
pub(super) fn mpi_rank(keys: &TrainConfig) -> anyhow::Result<Option<Box<dyn Communicator>>> {
    use headroom_train::launch::collective_deadline;
    if !headroom_train::comm::launched_by_mpirun() {
        return Ok(None);
    }
    let comm = headroom_train::comm::MpiRank::init(collective_deadline(keys.collective_timeout))
        .ok_or_else(|| anyhow::anyhow!("MPI was initialized twice"))?;
    if let Some(n) = keys.data_parallel.filter(|&n| n != comm.world_size()) {
        anyhow::bail!(
            "--data-parallel {n} under mpirun -n {}: the job's size is the number of ranks; drop --data-parallel",
            comm.world_size()
        );
    }
    if let Some(n) = keys.tensor_parallel.filter(|&n| n != comm.world_size()) {
        anyhow::bail!(
            "--tensor-parallel {n} under mpirun -n {}: a split model runs on every rank of the job; give mpirun -n {n}",
            comm.world_size()
        );
    }
    Ok(Some(Box::new(comm)))
}

/// Without the `mpi` build every run is one process (ranks, if any, are threads).
#[cfg(not(feature = "mpi"))]
pub(super) fn mpi_rank(_: &TrainConfig) -> anyhow::Result<Option<Box<dyn Communicator>>> {
    Ok(None)
}
