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

mod buffers;
mod prefetch;
mod report;

use super::dataset::{MapDataset, Windows, collate};
use super::error::DataError;
use super::order::{DistributedSampler, EpochOrders};
use super::sampler::{DataPosition, TokenBatch, TokenSampler};
pub use super::staging::{StagedBatch, Staging};
use super::staging::{budgeted_depth, worker_bytes};
use super::worker::{Done, Job, work};
use headroom_memory::host_pool::{HostPool, LOADER_WORKER_STACK_BYTES};
use prefetch::Ticket;
pub use report::LoaderReport;
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

    /// Warnings not yet passed on (the budget shrank the queue; the host is running out).
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
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
