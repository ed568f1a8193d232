//! The data loader: the trainer's source of batches. It keeps the sampler's resumable position
//! (`next_batch`, `skip_train`, `seek` move it exactly as the sampler alone would) and, with
//! `workers` > 0, has worker threads collate the batches it expects next into staging buffers
//! ahead of the trainer, at most `prefetch` of them queued.
//!
//! Batches are identical for any number of workers and any queue depth, because a batch is a
//! function of (seed, stream position, size) only: the loader predicts the next request (this
//! rank's shard of the stream, `order::DistributedSampler`, cut into pieces of the last size
//! asked for), hands a worker each prediction with a staging buffer to fill, and gives the
//! trainer a prefetched batch only when its position and size are the ones asked for. Anything
//! else — a seek, an out-of-memory retry with half the micro-batch, a rank's skip — drops the
//! predictions (their buffers come back) and starts again from the request.
//!
//! Threads rather than processes: the token file is memory-mapped once and shared, collating
//! is a copy with no interpreter lock to escape (the reason PyTorch uses processes), and a
//! thread costs its stack (`host_pool::LOADER_WORKER_STACK_BYTES`) instead of a process's copy
//! of the dataset.
//!
//! Staging buffers come from a `HostPool` (page-locked when permitted) bounded by
//! `--host-memory`: the queue shrinks before the budget is exceeded. A worker's failure (a
//! token outside the vocabulary, a panic) ends the next request with the file and offset.
//!
//! Not for: the order of windows (see `order`) or what a window is (see `dataset`).

use super::dataset::{MapDataset, Windows, collate};
use super::error::DataError;
use super::order::{DistributedSampler, EpochOrders};
use super::sampler::{DataPosition, TokenBatch, TokenSampler};
use super::staging::{FAULT_MAP_BYTES, budgeted_depth, staging_bytes, worker_bytes};
pub use super::staging::{StagedBatch, Staging};
use super::worker::{Done, Job, work};
use headroom_memory::format_bytes;
use headroom_memory::host_pool::{
    HostBuffer, HostPool, HostPoolStats, LOADER_WORKER_STACK_BYTES, loader_host_bytes,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;

/// How batches are produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Worker threads; 0 collates each batch on the trainer's thread when it is asked for.
    pub workers: usize,
    /// Most batches queued ahead of the trainer (with workers).
    pub prefetch: usize,
    /// Most host bytes the loader's buffers and workers may take.
    pub host_memory: Option<u64>,
    /// Page-lock staging buffers when the OS permits.
    pub pin_memory: bool,
    /// Sequences per micro-batch the run starts with (staging buffers are sized for it).
    pub micro_batch: usize,
    /// This rank's shard of the stream.
    pub shard: DistributedSampler,
}

/// What the loader did and held, for the run report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoaderReport {
    /// "text" (tokenized in memory) or "token file" (memory-mapped).
    pub source: String,
    pub workers: usize,
    pub prefetch: usize,
    /// The queue depth used: `prefetch`, or less where --host-memory required it.
    pub effective_prefetch: usize,
    pub batches: u64,
    /// Predictions dropped because the trainer asked for something else.
    pub restarts: u64,
    /// The most batches queued or being collated at once (never above the queue depth).
    pub peak_queue: usize,
    /// Seconds the trainer waited for batches.
    pub wait_s: f64,
    /// The loader's stated host bytes: staging buffers and workers.
    pub buffer_bytes: u64,
    pub per_worker_bytes: u64,
    /// Bytes of the epoch orders kept.
    pub index_bytes: u64,
    /// Tokens held in memory (a text corpus); 0 for a memory-mapped file.
    pub resident_token_bytes: u64,
    /// Bytes of the memory-mapped token file (not loaded; pages are read as touched).
    pub mapped_bytes: u64,
    /// The most bytes of the mapped file resident at once: what the page faults of the
    /// windows of the batches read since the last release (before each batch) and of the
    /// queued ones map (`staging::FAULT_MAP_BYTES` each), and never more than the file.
    pub mapped_resident_bound: u64,
    pub staging: HostPoolStats,
}

/// A batch queued ahead: its first stream position, its size, and whether its positions are
/// consecutive (only then can it be what the trainer asks for next).
#[derive(Debug, Clone, Copy)]
struct Ticket {
    seq: u64,
    first: u64,
    size: usize,
    contiguous: bool,
}

/// The trainer's source of batches (see the module header).
#[derive(Debug)]
pub struct Loader {
    sampler: TokenSampler,
    train: Arc<Windows>,
    orders: Arc<EpochOrders>,
    config: LoaderConfig,
    pool: HostPool,
    /// Staging buffers allowed (queue depth + the one the trainer holds).
    buffers: usize,
    /// Rows each staging buffer holds.
    rows: usize,
    allocated: usize,
    free: Vec<Staging>,
    back: Sender<Staging>,
    returned: Receiver<Staging>,
    jobs: Vec<Sender<Job>>,
    done: Option<Receiver<Done>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pending: VecDeque<Ticket>,
    /// Results come back in any order; each waits here for its turn (a failure too).
    ready: BTreeMap<u64, Result<Staging, DataError>>,
    next_seq: u64,
    /// This rank's index of the next predicted batch.
    next_local: u64,
    /// Numbers the current predictions; a result of an older one is recycled on arrival.
    generation: u64,
    /// Jobs sent to workers whose result has not come back.
    in_flight: usize,
    report: LoaderReport,
    warnings: Vec<String>,
    warned_host: bool,
}

impl Loader {
    /// A loader over `sampler`'s training windows; fails when --host-memory cannot hold one
    /// batch or a worker cannot be started.
    pub fn new(sampler: TokenSampler, config: LoaderConfig) -> Result<Loader, DataError> {
        let (train, orders) = sampler.shared();
        let seq_len = train.seq_len();
        let rows = config.micro_batch.max(1);
        let mut report = LoaderReport {
            workers: config.workers,
            prefetch: config.prefetch,
            ..LoaderReport::default()
        };
        let (buffers, depth, warning) = budgeted_depth(&config, rows, seq_len)?;
        report.effective_prefetch = depth;
        report.per_worker_bytes = worker_bytes(seq_len);
        let worker_total = config.workers as u64 * report.per_worker_bytes;
        let pool = HostPool::new(
            config.host_memory.map(|b| b.saturating_sub(worker_total)),
            config.pin_memory,
        );
        let (back, returned) = channel();
        let mut loader = Loader {
            sampler,
            train,
            orders,
            config,
            pool,
            buffers,
            rows,
            allocated: 0,
            free: Vec::new(),
            back,
            returned,
            jobs: Vec::new(),
            done: None,
            threads: Vec::new(),
            pending: VecDeque::new(),
            ready: BTreeMap::new(),
            next_seq: 0,
            next_local: 0,
            generation: 0,
            in_flight: 0,
            report,
            warnings: warning.into_iter().collect(),
            warned_host: false,
        };
        loader.spawn_workers()?;
        Ok(loader)
    }

    fn spawn_workers(&mut self) -> Result<(), DataError> {
        if self.config.workers == 0 {
            return Ok(());
        }
        let (done_tx, done_rx) = channel();
        for worker in 0..self.config.workers {
            let (tx, rx) = channel::<Job>();
            let dataset = self.train.clone();
            let done = done_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("loader-{worker}"))
                .stack_size(LOADER_WORKER_STACK_BYTES as usize)
                .spawn(move || work(worker, dataset, rx, done))
                .map_err(|source| DataError::Spawn { worker, source })?;
            self.jobs.push(tx);
            self.threads.push(handle);
        }
        self.done = Some(done_rx);
        Ok(())
    }

    /// The sampler whose position this loader keeps.
    pub fn sampler(&self) -> &TokenSampler {
        &self.sampler
    }

    pub fn position(&self) -> DataPosition {
        self.sampler.position()
    }

    /// Continues from a saved position (queued batches are dropped at the next request).
    pub fn seek(&mut self, position: DataPosition) {
        self.sampler.seek(position);
    }

    /// Moves past `batch` sequences (another rank's share) as drawing them would.
    pub fn skip_train(&mut self, batch: usize) {
        self.sampler.skip_train(batch);
    }

    /// The next training batch of `batch` sequences, in its staging buffers.
    pub fn next_batch(&mut self, batch: usize) -> Result<StagedBatch, DataError> {
        let started = Instant::now();
        self.check_host();
        // Only the pages of batches being read stay mapped (see `mapped_resident_bound`).
        self.train.tokens().release_pages();
        let first = self.sampler.stream_index();
        let windows = self.sampler.next_windows(batch);
        if batch > self.rows {
            self.resize(batch)?;
        }
        let staging = if self.config.workers == 0 {
            let mut s = self.take_buffer()?;
            self.fill(&windows, &mut s)?;
            s
        } else {
            self.prefetched(first, batch, &windows)?
        };
        self.report.batches += 1;
        self.report.wait_s += started.elapsed().as_secs_f64();
        Ok(StagedBatch {
            batch,
            seq_len: self.train.seq_len(),
            staging: Some(staging),
            back: self.back.clone(),
        })
    }

    /// As [`Self::next_batch`], as the sampler's owned `u32` batch (for tools and tests).
    pub fn next_train(&mut self, batch: usize) -> Result<TokenBatch, DataError> {
        let staged = self.next_batch(batch)?;
        let ids = |v: &[i64]| v.iter().map(|&t| t as u32).collect();
        Ok(TokenBatch {
            batch,
            seq_len: staged.seq_len,
            inputs: ids(staged.inputs()),
            targets: ids(staged.targets()),
        })
    }

    /// Collates `windows` on this thread.
    fn fill(&self, windows: &[usize], s: &mut Staging) -> Result<(), DataError> {
        let mut scratch = vec![0; self.train.sample_len()];
        let (inputs, targets) = s.halves();
        collate(
            self.train.as_ref(),
            windows.iter().copied(),
            inputs,
            targets,
            &mut scratch,
        )
        .map_err(DataError::from)
    }

    /// The batch at stream position `first` from the queue, after predicting it if needed.
    fn prefetched(
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
    fn drain(&mut self) -> Result<(), DataError> {
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

    fn recycle(&mut self, s: Staging) {
        if s.rows_of(self.train.seq_len()) >= self.rows {
            self.free.push(s);
        } else {
            self.allocated -= 1;
        }
    }

    /// A free staging buffer, allocating one while fewer than allowed exist.
    fn try_buffer(&mut self) -> Result<Option<Staging>, DataError> {
        while let Ok(s) = self.returned.try_recv() {
            self.recycle(s);
        }
        if let Some(s) = self.free.pop() {
            return Ok(Some(s));
        }
        if self.allocated >= self.buffers {
            return Ok(None);
        }
        let staging = Staging {
            ids: self.alloc(2 * self.rows * self.train.seq_len())?,
        };
        self.allocated += 1;
        Ok(Some(staging))
    }

    fn alloc(&self, n: usize) -> Result<HostBuffer<i64>, DataError> {
        self.pool.alloc(n).map_err(|e| DataError::HostBudget {
            budget: format_bytes(e.budget),
            batch: format_bytes(e.requested),
        })
    }

    /// A staging buffer for a batch collated on this thread: free, new, or given back by
    /// the workers once their predictions are dropped.
    fn take_buffer(&mut self) -> Result<Staging, DataError> {
        if let Some(s) = self.try_buffer()? {
            return Ok(s);
        }
        if self.config.workers > 0 {
            self.drain()?;
        }
        self.try_buffer()?.ok_or(DataError::BuffersHeld {
            buffers: self.buffers,
        })
    }

    /// Staging buffers for batches of `rows` sequences: predictions are dropped, every buffer
    /// comes back, and the queue depth is budgeted again.
    fn resize(&mut self, rows: usize) -> Result<(), DataError> {
        if self.config.workers > 0 {
            self.drain()?;
        }
        self.allocated -= self.free.len();
        self.free.clear();
        self.rows = rows;
        let (buffers, depth, warning) = budgeted_depth(&self.config, rows, self.train.seq_len())?;
        self.buffers = buffers;
        self.report.effective_prefetch = depth;
        self.warnings.extend(warning);
        Ok(())
    }

    /// Warns once when the host is close to running out of memory.
    fn check_host(&mut self) {
        if self.warned_host || !self.report.batches.is_multiple_of(16) {
            return;
        }
        let (Some(available), Some(total)) = (
            headroom_memory::host::available_bytes(),
            headroom_memory::host::total_bytes(),
        ) else {
            return;
        };
        if running_out(available, total) {
            self.warned_host = true;
            self.warnings.push(format!(
                "the host has {} of {} memory left; the OS may kill the run: lower --device-memory, --workers or --prefetch, or set --host-memory",
                format_bytes(available),
                format_bytes(total)
            ));
        }
    }

    /// Warnings not yet passed on (the budget shrank the queue; the host is running out).
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// What the loader did and held so far.
    pub fn report(&self) -> LoaderReport {
        let tokens = self.train.tokens();
        let (source, resident, mapped) = match tokens.as_ref() {
            super::dataset::Tokens::Owned(t) => ("text", 4 * t.len() as u64, 0),
            super::dataset::Tokens::Mapped(f) => ("token file", 0, f.header().file_bytes()),
        };
        let seq_len = self.train.seq_len() as u64;
        // A window may straddle two of what a fault maps.
        let window_bytes = (seq_len + 1) * 4 + 2 * FAULT_MAP_BYTES;
        // Pages are released before every batch: the last batch read, the one being collated
        // on this thread, and the queued ones are resident.
        let batches = 2 + self.report.effective_prefetch as u64;
        let mapped_resident_bound = mapped.min(batches * self.rows as u64 * window_bytes);
        LoaderReport {
            mapped_resident_bound,
            source: source.into(),
            buffer_bytes: loader_host_bytes(
                self.config.workers,
                self.report.effective_prefetch,
                staging_bytes(self.rows, self.train.seq_len()),
                4 * (seq_len + 1),
            ),
            index_bytes: self.orders.bytes(),
            resident_token_bytes: resident,
            mapped_bytes: mapped,
            staging: self.pool.stats(),
            ..self.report.clone()
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Closing the job channels ends the workers' loops.
        self.jobs.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Whether the host is about to run out: less than 5 % of its memory available.
fn running_out(available: u64, total: u64) -> bool {
    available < total / 20
}

#[cfg(test)]
mod tests {
    use super::running_out;

    #[test]
    fn the_host_warning_comes_below_five_percent_available() {
        // 24 GiB host: 5 % is 1.2 GiB.
        let total = 24 << 30;
        assert!(!running_out(total / 20, total));
        assert!(running_out(total / 20 - 1, total));
        assert!(!running_out(20 << 30, total));
    }
}
