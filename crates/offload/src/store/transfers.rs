//! The disk tier's transfers: swap buffers taken and given back, reads and writes submitted to
//! the I/O workers, and finished transfers filed (a write's checksum recorded, a read's buffer
//! kept until asked for, the caller's waiting timed). A region is never read while a write of it
//! is in flight, and never written twice at once.
//!
//! Not for: which regions are visited when (the store's public calls).

use super::{Backing, Disk, OffloadStore};
use crate::error::OffloadError;
use crate::io::{Done, Request};
use crate::page::AlignedBytes;
use std::time::Instant;

impl OffloadStore {
    pub(super) fn disk(&mut self) -> &mut Disk {
        match &mut self.backing {
            Backing::Disk(d) => d,
            _ => unreachable!("disk operations run on disk stores only"),
        }
    }

    pub(super) fn has_free(&self) -> bool {
        matches!(&self.backing, Backing::Disk(d) if !d.free.is_empty())
    }

    pub(super) fn take_free(&mut self) -> Result<AlignedBytes, OffloadError> {
        loop {
            if let Some(message) = &self.disk().failed {
                return Err(OffloadError::Workers(message.clone()));
            }
            if let Some(b) = self.disk().free.pop() {
                return Ok(b);
            }
            let disk = self.disk();
            if disk.reading.is_empty() && disk.writing.is_empty() {
                // Every buffer holds a prefetched region nobody asked for yet: drop the oldest.
                let oldest = *disk.ready.keys().next().expect("buffers exist");
                let b = disk.ready.remove(&oldest).expect("present");
                return Ok(b);
            }
            self.settle_one()?;
        }
    }

    pub(super) fn take_ready(&mut self, index: usize) -> Result<AlignedBytes, OffloadError> {
        loop {
            if let Some(b) = self.disk().ready.remove(&index) {
                return Ok(b);
            }
            if !self.disk().reading.contains(&index) {
                self.prefetch(index)?;
                continue;
            }
            self.settle_one()?;
        }
    }

    pub(super) fn submit_write(
        &mut self,
        index: usize,
        buffer: AlignedBytes,
    ) -> Result<(), OffloadError> {
        // Two writes of one region in flight could land out of order: the first one finishes.
        while self.disk().writing.contains(&index) {
            self.settle_one()?;
        }
        let region = &self.regions[index];
        let request = Request::Write {
            region: index,
            offset: region.offset,
            bytes: region.bytes,
            len: region.covered(),
            buffer,
        };
        let disk = self.disk();
        disk.writing.insert(index);
        disk.workers.submit(request)
    }

    /// Waits for one finished transfer and files it.
    pub(super) fn settle_one(&mut self) -> Result<(), OffloadError> {
        let start = Instant::now();
        let done: Done = self.disk().workers.next_done()?;
        self.stats.waited_seconds += start.elapsed().as_secs_f64();
        self.stats.io_seconds += done.seconds;
        let disk = self.disk();
        if let Err(e) = done.result {
            disk.failed = Some(e.to_string());
            disk.reading.remove(&done.region);
            disk.writing.remove(&done.region);
            disk.free.push(done.buffer);
            return Err(e);
        }
        if done.write {
            disk.writing.remove(&done.region);
            disk.crcs[done.region] = done.crc;
            disk.free.push(done.buffer);
            self.stats.bytes_written += done.bytes as u64;
        } else {
            disk.reading.remove(&done.region);
            disk.ready.insert(done.region, done.buffer);
            self.stats.bytes_read += done.bytes as u64;
        }
        Ok(())
    }
}
