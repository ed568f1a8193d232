//! A loader worker thread: it collates the windows of each job it is sent into the job's
//! staging buffer and sends the buffer back, until its job channel closes. A failure (a token
//! outside the vocabulary) or a panic is sent back in place of the batch, so the trainer never
//! waits on a worker that is gone.
//!
//! Not for: deciding what to collate (see `loader`).

use super::dataset::{MapDataset, Windows, collate};
use super::error::DataError;
use super::staging::Staging;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};

/// Windows to collate into a staging buffer, for the batch `seq` of prediction `generation`.
pub(super) struct Job {
    pub seq: u64,
    pub generation: u64,
    pub windows: Vec<usize>,
    pub staging: Staging,
}

/// A job's outcome, with its buffer.
pub(super) struct Done {
    pub seq: u64,
    pub generation: u64,
    pub worker: usize,
    pub result: Result<(), DataError>,
    pub staging: Staging,
}

/// A worker: collates each job's windows into its buffer and sends it back, until the job
/// channel closes. A panic is caught and reported, so the trainer never waits on a dead worker.
pub(super) fn work(worker: usize, dataset: Arc<Windows>, jobs: Receiver<Job>, done: Sender<Done>) {
    let mut scratch = vec![0u32; dataset.sample_len()];
    while let Ok(mut job) = jobs.recv() {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (inputs, targets) = job.staging.halves();
            collate(
                dataset.as_ref(),
                job.windows.iter().copied(),
                inputs,
                targets,
                &mut scratch,
            )
        }));
        let result = match result {
            Ok(r) => r.map_err(DataError::TokenFile),
            Err(panic) => Err(DataError::WorkerLost {
                worker,
                reason: panic_message(&panic),
            }),
        };
        let reply = Done {
            seq: job.seq,
            generation: job.generation,
            worker,
            result,
            staging: job.staging,
        };
        if done.send(reply).is_err() {
            return;
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "it panicked".into())
}
