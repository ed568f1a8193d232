//! The errors of `headroom train` a user can act on, with the fix added (an out-of-memory
//! step names the flags that make it fit), and the rank a launch's error happened on.

use headroom_memory::size::format_bytes;
use headroom_train::TrainError;
use headroom_train::launch::LaunchError;
use headroom_train::prepare::PrepareError;

/// Adds the fix to errors a user can act on.
fn explain(e: TrainError) -> anyhow::Error {
    match e {
        TrainError::OutOfMemory(oom) => anyhow::anyhow!(
            "{oom}\nThe run needs more than the device budget of {}: raise --device-memory, or lower --micro-batch (raising --accumulation keeps the effective batch, where the optimizer step does not run in backward).",
            format_bytes(oom.capacity)
        ),
        other => anyhow::Error::new(other),
    }
}

/// A launch's error, explained as [`explain`] does, naming the rank it happened on.
pub(super) fn explain_launch(e: LaunchError) -> anyhow::Error {
    match e {
        LaunchError::Train(e) => explain(*e),
        LaunchError::Rank { rank, source } => explain(*source).context(format!("rank {rank}")),
        other => anyhow::Error::new(other),
    }
}

pub(super) fn explain_prepare(e: PrepareError) -> anyhow::Error {
    match e {
        PrepareError::Train(e) => explain(e),
        other => anyhow::Error::new(other),
    }
}
