//! The ranks of a data-parallel `headroom train`: which process is which rank under `mpirun`
//! (the `mpi` build), how long a collective may wait for the others, and how a thread group's
//! outcome is told — the error of the rank where it happened, named, before the errors of the
//! ranks it left waiting.
//!
//! Not for: training a rank (`train`).

use super::train::Stopped;
use headroom_comm::Communicator;
use headroom_train::TrainError;
use headroom_train::config::TrainConfig;

/// A thread group's result: rank 0's, or the error that ended the group, told by the rank it
/// happened on (its own error or its panic), before the errors of the ranks it left waiting.
pub(super) fn group_outcome(
    outcomes: Vec<std::thread::Result<anyhow::Result<Option<Stopped>>>>,
) -> anyhow::Result<Option<Stopped>> {
    let mut lead = None;
    let mut cause = None;
    let mut abandoned = None;
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(Ok(stop)) if rank == 0 => lead = Some(stop),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let slot = if left_waiting(&e) {
                    &mut abandoned
                } else {
                    &mut cause
                };
                slot.get_or_insert(on_rank(e, rank));
            }
            Err(_) => {
                cause.get_or_insert(anyhow::anyhow!("rank {rank} panicked"));
            }
        }
    }
    match (cause.or(abandoned), lead) {
        (Some(e), _) => Err(e),
        (None, Some(stop)) => Ok(stop),
        (None, None) => Err(anyhow::anyhow!("no rank finished")),
    }
}

/// A rank's error, naming the rank (a collective's error names it already).
pub(super) fn on_rank(e: anyhow::Error, rank: usize) -> anyhow::Error {
    let named = e
        .downcast_ref::<TrainError>()
        .is_some_and(|t| matches!(t, TrainError::Communication(_)));
    if named {
        e
    } else {
        e.context(format!("rank {rank}"))
    }
}

/// Whether a rank's error is only that another rank failed while it waited.
fn left_waiting(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<TrainError>(),
        Some(TrainError::Communication(
            headroom_comm::CommError::PeerFailed { .. }
        ))
    )
}

/// This process's rank when `mpirun` started it (the `mpi` build); refuses a --data-parallel
/// that disagrees with the job's size.
#[cfg(feature = "mpi")]
pub(super) fn mpi_rank(keys: &TrainConfig) -> anyhow::Result<Option<Box<dyn Communicator>>> {
    if !headroom_comm::launched_by_mpirun() {
        return Ok(None);
    }
    let comm = headroom_comm::MpiRank::init(collective_deadline(keys.collective_timeout))
        .ok_or_else(|| anyhow::anyhow!("MPI was initialized twice"))?;
    if let Some(n) = keys.data_parallel.filter(|&n| n != comm.world_size()) {
        anyhow::bail!(
            "--data-parallel {n} under mpirun -n {}: the job's size is the number of ranks; drop --data-parallel",
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

/// Whether a rank's error is a collective's deadline passing (a stuck rank).
pub(super) fn timed_out(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<TrainError>(),
        Some(TrainError::Communication(
            headroom_comm::CommError::Timeout { .. }
        ))
    )
}

/// How long a rank waits in a collective for the others before the run ends naming the
/// missing ranks (the watchdog of a stuck rank): `--collective-timeout`, 600 s by default.
pub(super) fn collective_deadline(seconds: Option<f64>) -> std::time::Duration {
    std::time::Duration::from_secs_f64(
        seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(600.0),
    )
}
