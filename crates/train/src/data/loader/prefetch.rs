//! The loader's prefetch queue: predicting the batches the trainer asks for next, handing each
//! to a worker with a staging buffer, and giving a prefetched batch only when its position and
//! size are the ones asked for (else the predictions are dropped and begin again).
//!
//! Not for: where the staging buffers come from (see `buffers`) or the worker's loop (see
//! `worker`).

use super::Loader;
use crate::data::error::DataError;
use crate::data::staging::Staging;
use crate::data::worker::{Done, Job};

/// A batch queued ahead: its first stream position, its size, and whether its positions are
/// consecutive (only then can it be what the trainer asks for next).
#[derive(Debug, Clone, Copy)]
pub(super) struct Ticket {
    seq: u64,
    first: u64,
    size: usize,
    contiguous: bool,
}

impl Loader {
    /// The batch at stream position `first` from the queue, after predicting it if needed.
    pub(super) fn prefetched(
        &mut self,
        first: u64,
        size: usize,
        windows: &[usize],
    ) -> Result<Staging, DataError> {
        let hit = self
            .pending
            .front()
            .is_some_and(|t| t.contiguous && t.first == first && t.size == size);
        if !hit {
            if !self.pending.is_empty() {
                self.report.restarts += 1;
            }
            self.drop_predictions();
            match self.config.shard.local(first) {
                Some(local) => self.next_local = local,
                None => {
                    // Outside this rank's shard: nothing to predict from; collate it here.
                    let mut s = self.take_buffer()?;
                    self.fill(windows, &mut s)?;
                    return Ok(s);
                }
            }
        }
        self.refill(size)?;
        let ticket = self.pending.pop_front().ok_or(DataError::BuffersHeld {
            buffers: self.buffers,
        })?;
        let staging = self.wait_for(ticket.seq)?;
        self.refill(size)?;
        Ok(staging)
    }

    /// Forgets the queued predictions; their buffers come back (now, or when their worker is
    /// done with them).
    fn drop_predictions(&mut self) {
        self.generation += 1;
        self.pending.clear();
        for s in std::mem::take(&mut self.ready).into_values().flatten() {
            self.recycle(s);
        }
    }

    /// Drops the predictions and waits until every worker has given its buffer back.
    pub(super) fn drain(&mut self) -> Result<(), DataError> {
        self.drop_predictions();
        while self.in_flight > 0 {
            let d = self.receive()?;
            self.recycle(d.staging);
        }
        Ok(())
    }

    /// The next result from any worker.
    fn receive(&mut self) -> Result<Done, DataError> {
        let done = self.done.as_ref().expect("workers are running");
        let d = done.recv().map_err(|_| DataError::WorkerLost {
            worker: 0,
            reason: "every worker thread has ended".into(),
        })?;
        self.in_flight -= 1;
        Ok(d)
    }

    /// Queues predictions until the queue is full or no buffer is free.
    fn refill(&mut self, size: usize) -> Result<(), DataError> {
        while self.pending.len() < self.report.effective_prefetch {
            let staging = match self.try_buffer()? {
                Some(s) => s,
                // Only stale predictions are out: wait for one of their buffers.
                None if self.pending.is_empty() && self.in_flight > 0 => {
                    let d = self.receive()?;
                    self.recycle(d.staging);
                    continue;
                }
                None => break,
            };
            let shard = self.config.shard;
            let local = self.next_local;
            let positions: Vec<u64> = (0..size as u64).map(|i| shard.global(local + i)).collect();
            let windows = positions
                .iter()
                .map(|&g| self.orders.window_at(g))
                .collect();
            let ticket = Ticket {
                seq: self.next_seq,
                first: positions[0],
                size,
                contiguous: positions.windows(2).all(|p| p[1] == p[0] + 1),
            };
            let worker = (ticket.seq % self.jobs.len() as u64) as usize;
            let job = Job {
                seq: ticket.seq,
                generation: self.generation,
                windows,
                staging,
            };
            if self.jobs[worker].send(job).is_err() {
                return Err(DataError::WorkerLost {
                    worker,
                    reason: "its thread has ended".into(),
                });
            }
            self.in_flight += 1;
            self.next_seq += 1;
            self.next_local += size as u64;
            self.pending.push_back(ticket);
            self.report.peak_queue = self.report.peak_queue.max(self.pending.len());
        }
        Ok(())
    }

    /// Waits for the batch `seq`, recycling the buffers of dropped predictions.
    fn wait_for(&mut self, seq: u64) -> Result<Staging, DataError> {
        loop {
            if let Some(result) = self.ready.remove(&seq) {
                return result;
            }
            let d = self.receive()?;
            if d.generation != self.generation {
                self.recycle(d.staging);
                continue;
            }
            let result = match d.result {
                Ok(()) => Ok(d.staging),
                Err(e) => {
                    self.recycle(d.staging);
                    Err(match e {
                        DataError::TokenFile(source) => DataError::Worker {
                            worker: d.worker,
                            source,
                        },
                        other => other,
                    })
                }
            };
            self.ready.insert(d.seq, result);
        }
    }
}
