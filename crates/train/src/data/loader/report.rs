//! What the loader did and held, for the run report (`LoaderReport`), and its warning when the
//! host is running out of memory.
//!
//! Not for: the host pool's own accounting (see `headroom_memory::host_pool`).

use super::Loader;
use crate::data::dataset::Tokens;
use crate::data::staging::{FAULT_MAP_BYTES, staging_bytes};
use headroom_memory::format_bytes;
use headroom_memory::host_pool::{HostPoolStats, loader_host_bytes};
use serde::{Deserialize, Serialize};

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

impl Loader {
    /// Warns once when the host is close to running out of memory.
    pub(super) fn check_host(&mut self) {
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

    /// What the loader did and held so far.
    pub fn report(&self) -> LoaderReport {
        let tokens = self.train.tokens();
        let (source, resident, mapped) = match tokens.as_ref() {
            Tokens::Owned(t) => ("text", 4 * t.len() as u64, 0),
            Tokens::Mapped(f) => ("token file", 0, f.header().file_bytes()),
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
