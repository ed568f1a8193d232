//! An offload store: a list of regions, each of parts tagged with a memory category (a block
//! shard's fp32 master weights and optimizer states; its 16-bit parameters), kept in host
//! memory (one page-aligned buffer per region) or in one file (each region a whole number of
//! pages at its own offset, moved through `swap_buffers` page-aligned host buffers by I/O
//! workers). Every part starts on a page boundary and is counted in whole pages, so the bytes
//! per category on each tier are `Σ page_rounded(part bytes)`.
//!
//! Access: [`OffloadStore::visit`] hands out regions in a given order for read-modify-write
//! (the optimizer step: reading the next region while the current one is updated and writing the
//! previous one behind it); [`OffloadStore::prefetch`] and [`OffloadStore::read`] read one
//! (parameters before a block computes, saves); [`OffloadStore::write`] replaces one
//! (updated parameters, a resumed run), written behind on disk. A dry store counts the same
//! bytes, swap buffers included, and hands out `None`.
//!
//! Not for: what the parts mean (the trainer).

use crate::disk::DiskFile;
use crate::error::OffloadError;
use crate::io::{IoWorkers, Request};
use crate::page::{AlignedBytes, page_rounded};
use crate::stats::{TierKind, TierStats};
use headroom_memory::Category;
use headroom_memory::host_pool::{HostPool, HostReservation};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// One part of a region: its category and exact bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub category: Category,
    pub bytes: usize,
}

/// How a store is built.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// What it holds, for reports and the start of the file's name (the rest names the run).
    pub name: String,
    pub tier: TierKind,
    /// Directory of the file (disk tier).
    pub dir: Option<PathBuf>,
    /// Host swap buffers of the disk tier (at least 2: one worked on, one in transfer).
    pub swap_buffers: usize,
    /// I/O worker threads of the disk tier (requests in flight at once).
    pub io_workers: usize,
    /// Count bytes only (a dry run).
    pub dry: bool,
}

#[derive(Debug)]
struct Region {
    parts: Vec<Part>,
    /// Start of each part within the region (page-aligned).
    starts: Vec<usize>,
    /// Whole pages of the region.
    bytes: usize,
    /// Offset in the file (disk tier).
    offset: u64,
}

impl Region {
    fn new(parts: Vec<Part>, offset: u64) -> Region {
        let mut starts = Vec::with_capacity(parts.len());
        let mut at = 0;
        for p in &parts {
            starts.push(at);
            at += page_rounded(p.bytes);
        }
        Region {
            parts,
            starts,
            bytes: at,
            offset,
        }
    }

    /// Bytes the checksum covers: up to the end of the last part.
    fn covered(&self) -> usize {
        match (self.starts.last(), self.parts.last()) {
            (Some(s), Some(p)) => s + p.bytes,
            _ => 0,
        }
    }
}

/// A region's parts for writing, each exactly its bytes long.
#[derive(Debug)]
pub struct RegionMut<'a> {
    pub parts: Vec<&'a mut [u8]>,
}

fn split_parts<'a>(region: &Region, mut bytes: &'a mut [u8]) -> RegionMut<'a> {
    let mut parts = Vec::with_capacity(region.parts.len());
    let mut at = 0;
    for (p, &start) in region.parts.iter().zip(&region.starts) {
        let (_, rest) = bytes.split_at_mut(start - at);
        let (part, rest) = rest.split_at_mut(page_rounded(p.bytes));
        parts.push(&mut part[..p.bytes]);
        bytes = rest;
        at = start + page_rounded(p.bytes);
    }
    RegionMut { parts }
}

enum Backing {
    /// Dry run: reservations of the host bytes a real store would hold.
    Counted(Vec<HostReservation>),
    Host(Vec<AlignedBytes>),
    Disk(Box<Disk>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backing::Counted(_) => "Counted",
            Backing::Host(_) => "Host",
            Backing::Disk(_) => "Disk",
        })
    }
}

struct Disk {
    workers: IoWorkers,
    /// Checksum of each region's last write.
    crcs: Vec<u32>,
    free: Vec<AlignedBytes>,
    /// Regions read and not yet used.
    ready: BTreeMap<usize, AlignedBytes>,
    reading: BTreeSet<usize>,
    writing: BTreeSet<usize>,
    /// An I/O error ends the store: later calls repeat it instead of using unknown bytes.
    failed: Option<String>,
}

/// Regions on one tier.
#[derive(Debug)]
pub struct OffloadStore {
    options: StoreOptions,
    pool: HostPool,
    regions: Vec<Region>,
    backing: Backing,
    stats: TierStats,
}

impl OffloadStore {
    /// An empty store whose host buffers come from `pool`.
    pub fn new(pool: HostPool, options: StoreOptions) -> Result<OffloadStore, OffloadError> {
        let mut stats = TierStats {
            name: options.name.clone(),
            tier: options.tier,
            ..TierStats::default()
        };
        let backing = match (options.dry, options.tier) {
            (true, _) => Backing::Counted(Vec::new()),
            (false, TierKind::Host) => Backing::Host(Vec::new()),
            (false, TierKind::Disk) => {
                let dir = options.dir.clone().unwrap_or_else(std::env::temp_dir);
                std::fs::create_dir_all(&dir).map_err(|source| OffloadError::Directory {
                    path: dir.clone(),
                    source,
                })?;
                let file = Arc::new(DiskFile::create(
                    &dir.join(scratch_file_name(&options.name)),
                )?);
                stats.path = Some(file.path().display().to_string());
                stats.direct_io = file.is_direct();
                stats.buffered_reason = file.buffered_reason().map(str::to_string);
                let workers = IoWorkers::start(file.clone(), options.io_workers)?;
                Backing::Disk(Box::new(Disk {
                    workers,
                    crcs: Vec::new(),
                    free: Vec::new(),
                    ready: BTreeMap::new(),
                    reading: BTreeSet::new(),
                    writing: BTreeSet::new(),
                    failed: None,
                }))
            }
        };
        if options.tier == TierKind::Disk {
            stats.swap_buffers = options.swap_buffers.max(2);
        }
        stats.pinned = true;
        Ok(OffloadStore {
            options,
            pool,
            regions: Vec::new(),
            backing,
            stats,
        })
    }

    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// Adds a region of `parts`, its bytes set by `init` (zeros before it runs; not called on a
    /// dry store). Returns its index.
    pub fn add_region(
        &mut self,
        parts: Vec<Part>,
        init: impl FnOnce(RegionMut<'_>),
    ) -> Result<usize, OffloadError> {
        let offset = self.regions.last().map_or(0, |r| r.offset + r.bytes as u64);
        let region = Region::new(parts, offset);
        let tier = self.options.tier;
        for p in &region.parts {
            let target = match tier {
                TierKind::Host => &mut self.stats.host,
                TierKind::Disk => &mut self.stats.disk,
            };
            target[p.category] += page_rounded(p.bytes) as u64;
        }
        let index = self.regions.len();
        let bytes = region.bytes;
        self.regions.push(region);
        if tier == TierKind::Disk {
            self.grow_swap_buffers()?;
        }
        match &mut self.backing {
            Backing::Counted(held) => {
                if tier == TierKind::Host {
                    held.push(self.pool.reserve(bytes as u64)?);
                }
            }
            Backing::Host(buffers) => {
                let mut buffer = AlignedBytes::new(&self.pool, bytes)?;
                note_pinning(&mut self.stats, &buffer, &self.pool);
                init(split_parts(&self.regions[index], buffer.as_bytes_mut()));
                buffers.push(buffer);
            }
            Backing::Disk(disk) => {
                disk.crcs.push(0);
                let mut buffer = self.take_free()?;
                let region = &self.regions[index];
                buffer.as_bytes_mut()[..region.bytes].fill(0);
                init(split_parts(region, buffer.as_bytes_mut()));
                self.submit_write(index, buffer)?;
            }
        }
        Ok(index)
    }

    /// Swap buffers as large as the largest region (disk tier), counted in both kinds of store.
    fn grow_swap_buffers(&mut self) -> Result<(), OffloadError> {
        let largest = self.regions.iter().map(|r| r.bytes).max().unwrap_or(0) as u64;
        if largest <= self.stats.swap_buffer_bytes {
            return Ok(());
        }
        self.wait_idle()?;
        let count = self.stats.swap_buffers;
        self.stats.swap_buffer_bytes = largest;
        match &mut self.backing {
            Backing::Counted(held) => {
                // A dry disk store reserves its swap buffers only.
                held.clear();
                for _ in 0..count {
                    held.push(self.pool.reserve(largest)?);
                }
            }
            Backing::Disk(disk) => {
                disk.free.clear();
                disk.ready.clear();
                for _ in 0..count {
                    let buffer = AlignedBytes::new(&self.pool, largest as usize)?;
                    note_pinning(&mut self.stats, &buffer, &self.pool);
                    disk.free.push(buffer);
                }
            }
            Backing::Host(_) => {}
        }
        Ok(())
    }

    /// Read-modify-write of the regions in `order`: `f` gets each region's parts (`None` on a
    /// dry store). On disk, the next regions are read while `f` works and each is written
    /// behind it; the call returns once every write is done.
    pub fn visit<E: From<OffloadError>>(
        &mut self,
        order: &[usize],
        mut f: impl FnMut(usize, Option<RegionMut<'_>>) -> Result<(), E>,
    ) -> Result<(), E> {
        match &mut self.backing {
            Backing::Counted(_) => {
                for &i in order {
                    f(i, None)?;
                }
                return Ok(());
            }
            Backing::Host(buffers) => {
                for &i in order {
                    f(
                        i,
                        Some(split_parts(&self.regions[i], buffers[i].as_bytes_mut())),
                    )?;
                }
                return Ok(());
            }
            Backing::Disk(_) => {}
        }
        let mut issued = 0;
        for (k, &i) in order.iter().enumerate() {
            // Read ahead as far as free buffers allow.
            while issued < order.len() && (issued <= k || self.has_free()) {
                self.prefetch(order[issued])?;
                issued += 1;
            }
            let mut buffer = self.take_ready(i)?;
            f(
                i,
                Some(split_parts(&self.regions[i], buffer.as_bytes_mut())),
            )?;
            self.submit_write(i, buffer)?;
        }
        self.wait_idle()?;
        Ok(())
    }

    /// Starts reading region `index` if it is on disk and neither read nor being read; a no-op
    /// on the other tiers.
    pub fn prefetch(&mut self, index: usize) -> Result<(), OffloadError> {
        let Backing::Disk(disk) = &self.backing else {
            return Ok(());
        };
        if disk.ready.contains_key(&index) || disk.reading.contains(&index) {
            return Ok(());
        }
        // A read must see the region's last write.
        while self.disk().writing.contains(&index) {
            self.settle_one()?;
        }
        let buffer = self.take_free()?;
        let region = &self.regions[index];
        let (offset, bytes, len) = (region.offset, region.bytes, region.covered());
        let disk = self.disk();
        let request = Request::Read {
            region: index,
            offset,
            bytes,
            len,
            crc: disk.crcs[index],
            buffer,
        };
        disk.reading.insert(index);
        disk.workers.submit(request)
    }

    /// Region `index`'s parts for reading (`None` on a dry store).
    pub fn read<R>(
        &mut self,
        index: usize,
        f: impl FnOnce(Option<RegionMut<'_>>) -> R,
    ) -> Result<R, OffloadError> {
        match &mut self.backing {
            Backing::Counted(_) => Ok(f(None)),
            Backing::Host(buffers) => Ok(f(Some(split_parts(
                &self.regions[index],
                buffers[index].as_bytes_mut(),
            )))),
            Backing::Disk(_) => {
                self.prefetch(index)?;
                let mut buffer = self.take_ready(index)?;
                let out = f(Some(split_parts(
                    &self.regions[index],
                    buffer.as_bytes_mut(),
                )));
                self.disk().free.push(buffer);
                Ok(out)
            }
        }
    }

    /// Replaces region `index`'s bytes with what `f` writes into its parts (zeroed first on
    /// disk, holding the current bytes in host memory); on disk the write is behind the call.
    pub fn write(
        &mut self,
        index: usize,
        f: impl FnOnce(Option<RegionMut<'_>>),
    ) -> Result<(), OffloadError> {
        match &mut self.backing {
            Backing::Counted(_) => f(None),
            Backing::Host(buffers) => f(Some(split_parts(
                &self.regions[index],
                buffers[index].as_bytes_mut(),
            ))),
            Backing::Disk(_) => {
                // A read of the old bytes in flight or done is no longer wanted.
                while self.disk().reading.contains(&index) {
                    self.settle_one()?;
                }
                if let Some(stale) = self.disk().ready.remove(&index) {
                    self.disk().free.push(stale);
                }
                let mut buffer = self.take_free()?;
                let region = &self.regions[index];
                buffer.as_bytes_mut()[..region.bytes].fill(0);
                f(Some(split_parts(region, buffer.as_bytes_mut())));
                self.submit_write(index, buffer)?;
            }
        }
        Ok(())
    }

    /// Waits for every transfer in flight; prefetched regions stay read.
    pub fn wait_idle(&mut self) -> Result<(), OffloadError> {
        while let Backing::Disk(disk) = &self.backing
            && !(disk.reading.is_empty() && disk.writing.is_empty())
        {
            self.settle_one()?;
        }
        Ok(())
    }

    /// What the store holds and has moved.
    pub fn stats(&self) -> TierStats {
        self.stats.clone()
    }
}

/// The name of a disk store's file: what it holds, then this process's id, the store's number
/// in this process and a stamp from the clock, so that runs sharing an offload directory (the
/// default one included) never open each other's files, and a store never reuses a file that a
/// dead process with the same id left behind. The file goes with its store.
fn scratch_file_name(name: &str) -> String {
    static STORES: AtomicU64 = AtomicU64::new(0);
    let number = STORES.fetch_add(1, Ordering::Relaxed);
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() ^ d.as_secs() as u32);
    format!("{name}.{}-{number}-{stamp:08x}.bin", std::process::id())
}

/// Records whether `buffer` is page-locked, and the pool's reason when it is not.
fn note_pinning(stats: &mut TierStats, buffer: &AlignedBytes, pool: &HostPool) {
    if !buffer.is_pinned() {
        stats.pinned = false;
        if stats.pin_error.is_none() {
            stats.pin_error = pool.stats().pin_error;
        }
    }
}

impl Drop for OffloadStore {
    fn drop(&mut self) {
        // Writes behind the last call finish before the file closes.
        let _ = self.wait_idle();
    }
}

mod transfers;

#[cfg(test)]
mod tests;
