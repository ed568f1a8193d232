//! Staging buffers: where a batch waits between collating and the copy into device memory, one
//! allocation from the host pool per batch (inputs, then targets), handed to the trainer as a
//! `StagedBatch` that gives it back when dropped; and the loader's host budget — how deep the
//! prefetch queue may be within `--host-memory`.
//!
//! Not for: filling the buffers (see `worker`, `loader`) or the pool's accounting (see
//! `headroom_memory::host_pool`).

use super::error::DataError;
use super::loader::LoaderConfig;
use headroom_memory::format_bytes;
use headroom_memory::host_pool::{HostBuffer, LOADER_WORKER_STACK_BYTES, loader_host_bytes};
use std::sync::mpsc::Sender;

/// A batch in one staging buffer: the inputs, then the targets, each (rows, seq_len) token ids
/// as the device's `i64`.
#[derive(Debug)]
pub struct Staging {
    pub(super) ids: HostBuffer<i64>,
}

impl Staging {
    /// Inputs and targets, each half of the buffer.
    pub(super) fn halves(&mut self) -> (&mut [i64], &mut [i64]) {
        let half = self.ids.len() / 2;
        self.ids.split_at_mut(half)
    }

    pub(super) fn rows_of(&self, seq_len: usize) -> usize {
        self.ids.len() / 2 / seq_len
    }
}

/// A batch handed to the trainer; its buffers go back to the loader when it is dropped.
#[derive(Debug)]
pub struct StagedBatch {
    pub batch: usize,
    pub seq_len: usize,
    pub(super) staging: Option<Staging>,
    pub(super) back: Sender<Staging>,
}

impl StagedBatch {
    pub fn inputs(&self) -> &[i64] {
        let ids = &self.staging.as_ref().expect("present until dropped").ids;
        &ids[..self.batch * self.seq_len]
    }
    pub fn targets(&self) -> &[i64] {
        let ids = &self.staging.as_ref().expect("present until dropped").ids;
        let half = ids.len() / 2;
        &ids[half..half + self.batch * self.seq_len]
    }
}

impl Drop for StagedBatch {
    fn drop(&mut self) {
        if let Some(s) = self.staging.take() {
            // The loader may be gone already; then the buffers are simply freed.
            let _ = self.back.send(s);
        }
    }
}

/// The most one page fault of a file may map: Linux maps 64 KiB around a fault
/// (`fault_around_bytes`) or a whole large page-cache folio (up to 256 KiB measured on Linux
/// 6.18 with ext4). It bounds the resident bytes one window read adds.
pub const FAULT_MAP_BYTES: u64 = 256 << 10;

/// Bytes of one staging buffer: inputs and targets of `rows` × `seq_len` `i64` ids.
pub fn staging_bytes(rows: usize, seq_len: usize) -> u64 {
    2 * 8 * (rows * seq_len) as u64
}

/// A worker's bytes besides the staging buffers: its stack and one window of scratch.
pub(super) fn worker_bytes(seq_len: usize) -> u64 {
    LOADER_WORKER_STACK_BYTES + 4 * (seq_len as u64 + 1)
}

/// Staging buffers allowed, the queue depth, and a warning if the budget shrank it; an error
/// when the budget cannot hold the least the loader needs (one batch, and one queued batch
/// with workers).
pub(super) fn budgeted_depth(
    config: &LoaderConfig,
    rows: usize,
    seq_len: usize,
) -> Result<(usize, usize, Option<String>), DataError> {
    let batch_bytes = staging_bytes(rows, seq_len);
    let scratch = 4 * (seq_len as u64 + 1);
    let bytes = |depth: usize| loader_host_bytes(config.workers, depth, batch_bytes, scratch);
    let (least, wanted) = match config.workers {
        0 => (0, 0),
        _ => (1, config.prefetch.max(1)),
    };
    let fits = |depth: usize| {
        config
            .host_memory
            .is_none_or(|budget| bytes(depth) <= budget)
    };
    let Some(depth) = (least..=wanted).rev().find(|&d| fits(d)) else {
        return Err(DataError::HostBudget {
            budget: format_bytes(config.host_memory.unwrap_or(0)),
            batch: format_bytes(bytes(least)),
        });
    };
    let warning = (depth < wanted).then(|| {
        format!(
            "--host-memory {} holds a queue of {depth} batches, not --prefetch {wanted}: the queue was shortened to stay within it",
            format_bytes(config.host_memory.unwrap_or(0))
        )
    });
    let buffers = headroom_memory::host_pool::staging_buffers(config.workers, depth);
    Ok((buffers, depth, warning))
}
