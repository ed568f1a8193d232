//! The loader's staging buffers: recycled when they come back, allocated from the host pool
//! while fewer than the budget allows exist, and sized again when the micro-batch grows.
//!
//! Not for: the buffers themselves or the budget's arithmetic (see `staging`).

use super::Loader;
use crate::data::error::DataError;
use crate::data::staging::{Staging, budgeted_depth};
use headroom_memory::format_bytes;
use headroom_memory::host_pool::HostBuffer;

impl Loader {
    pub(super) fn recycle(&mut self, s: Staging) {
        if s.rows_of(self.train.seq_len()) >= self.rows {
            self.free.push(s);
        } else {
            self.allocated -= 1;
        }
    }

    /// A free staging buffer, allocating one while fewer than allowed exist.
    pub(super) fn try_buffer(&mut self) -> Result<Option<Staging>, DataError> {
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
    pub(super) fn take_buffer(&mut self) -> Result<Staging, DataError> {
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
    pub(super) fn resize(&mut self, rows: usize) -> Result<(), DataError> {
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
}
