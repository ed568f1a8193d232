//! The caching allocator: PyTorch's `DeviceCachingAllocator` semantics on a capacity-limited
//! device. Requests are rounded, served best-fit from a small or a large pool of cached blocks,
//! split and merged as PyTorch does; new segments come from a [`SegmentSource`] only when no
//! cached block fits, and the retry ladder (garbage collection, release of oversize blocks,
//! release of all cached segments) runs before an [`OutOfMemory`] error.
//!
//! Two improvements over PyTorch (docs/sources.md §5): the pool is searched again after every
//! reclaim step (PyTorch does not, pytorch/pytorch#189504), and in expandable mode a best-fit
//! candidate that cannot be backed within the capacity does not end the search — the next
//! candidate is tried.
//!
//! Not for: tensors (see `device` for the owning handle) or text reports (see `summary`).

mod blocks;
mod counting;
mod expandable;
mod planned;
mod reclaim;
mod view;
mod window;

pub use planned::{ArenaError, ArenaReport};
pub use view::{BlockState, BlockView, SegmentView};
pub use window::{NameBytes, Window};

use crate::breakdown::CategoryBytes;
use crate::category::Category;
use crate::config::AllocatorConfig;
use crate::oom::OutOfMemory;
use crate::rounding::{MAX_REQUEST, MIN_BLOCK_SIZE, Pool, SMALL_SIZE, allocation_size, round_size};
use crate::source::SegmentSource;
use crate::stats::DeviceStats;
use crate::trace::{Trace, TraceAction};
use blocks::{Block, BlockId, Blocks, Segment};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// What a successful allocation hands back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// Device address of the block.
    pub addr: u64,
    /// Block size (rounded; may exceed the request by split slack).
    pub size: u64,
    /// The caller's request.
    pub requested: u64,
}

/// A free of an address the allocator does not hand out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "free of address {addr:#x}, which is not an allocated block (double free or foreign pointer)"
)]
pub struct InvalidFree {
    pub addr: u64,
}

/// A caching allocator for one device.
#[derive(Debug)]
pub struct CachingAllocator {
    capacity: u64,
    config: AllocatorConfig,
    source: Box<dyn SegmentSource>,
    device_name: String,
    blocks: Blocks,
    /// Allocated blocks by address.
    live: HashMap<u64, BlockId>,
    /// Segments by base address.
    segments: BTreeMap<u64, Segment>,
    /// Base address of each pool's expandable segment, once created (index: small, large).
    expandable: [Option<u64>; 2],
    /// Number of best-fit searches per pool (PyTorch's `get_free_blocks_call_count`).
    searches: [u64; 2],
    stats: DeviceStats,
    trace: Trace,
    /// The open measurement window, if a caller opened one.
    window: Option<Window>,
    /// The planned arena, once a plan is installed.
    arena: Option<planned::Arena>,
    /// Records windows' requests for a plan (dry runs).
    recorder: Option<crate::arena::Recorder>,
}

impl CachingAllocator {
    /// An allocator for a device of `capacity` bytes whose segments come from `source`.
    pub fn new(capacity: u64, config: AllocatorConfig, source: Box<dyn SegmentSource>) -> Self {
        let stats = DeviceStats {
            max_split_size: if config.max_split_size == u64::MAX {
                -1
            } else {
                config.max_split_size as i64
            },
            ..Default::default()
        };
        CachingAllocator {
            capacity,
            config,
            source,
            device_name: "cpu:0".to_string(),
            blocks: Blocks::default(),
            live: HashMap::new(),
            segments: BTreeMap::new(),
            expandable: [None, None],
            searches: [0, 0],
            stats,
            trace: Trace::default(),
            window: None,
            arena: None,
            recorder: None,
        }
    }

    /// Sets the device name used in messages and snapshots (`cpu:0`, `cuda:1`).
    pub fn set_device_name(&mut self, name: impl Into<String>) {
        self.device_name = name.into();
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Whether addresses point at real memory.
    pub fn is_backed(&self) -> bool {
        self.source.is_backed()
    }

    /// `memory_stats()`.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    pub fn trace_mut(&mut self) -> &mut Trace {
        &mut self.trace
    }

    /// Bytes currently reserved from the source.
    pub fn reserved(&self) -> u64 {
        self.stats.reserved_bytes.all.current as u64
    }

    /// Bytes currently handed out.
    pub fn allocated(&self) -> u64 {
        self.stats.allocated_bytes.all.current as u64
    }

    /// `reset_peak_memory_stats()`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peaks();
    }

    /// Opens a measurement window (closing the previous one): its peak, the breakdown at that
    /// peak and each name's largest live bytes start from what is live now.
    pub fn open_window(&mut self) {
        let allocated = self.allocated();
        let by_category = self.stats.current_category_bytes();
        let mut w = self.window.take().unwrap_or_default();
        if w.names.is_empty() {
            for seg in self.segments() {
                for b in seg.blocks {
                    if let Some(category) = b.category {
                        w.add_live(b.name.as_deref(), category, b.size);
                    }
                }
            }
        }
        w.open(allocated, by_category);
        self.window = Some(w);
    }

    /// The open window, if any.
    pub fn window(&self) -> Option<&Window> {
        self.window.as_ref()
    }

    /// Allocates `size` bytes tagged with `category` and an optional name.
    pub fn malloc(
        &mut self,
        size: u64,
        category: Category,
        name: Option<&str>,
    ) -> Result<Allocation, OutOfMemory> {
        let name: Option<Arc<str>> = name.map(Arc::from);
        if size >= MAX_REQUEST {
            return Err(self.out_of_memory(size, size, size, name));
        }
        let rounded = round_size(size, self.config.divisions_for(size));
        let found = match self.malloc_planned(rounded, size, category, &name) {
            Some(a) => Ok(a),
            None => self.malloc_cached(rounded, size, category, name),
        };
        if let (Ok(a), Some(r)) = (&found, self.recorder.as_mut()) {
            r.on_alloc(a.addr, rounded, category);
        }
        found
    }

    /// A request served by the caching pools.
    fn malloc_cached(
        &mut self,
        rounded: u64,
        size: u64,
        category: Category,
        name: Option<Arc<str>>,
    ) -> Result<Allocation, OutOfMemory> {
        let pool = Pool::for_size(rounded);
        let id = if self.config.expandable_segments {
            self.malloc_expandable(pool, rounded)
        } else {
            self.malloc_segmented(pool, rounded)
        };
        match id {
            Some(id) => Ok(self.alloc_found_block(id, rounded, size, category, name)),
            None => Err(self.out_of_memory(size, rounded, allocation_size(rounded), name)),
        }
    }

    /// The retry ladder for fixed-size segments: cached search → garbage collection → new
    /// segment → release oversize blocks → release all cached segments (a counted retry) → OOM.
    fn malloc_segmented(&mut self, pool: Pool, rounded: u64) -> Option<BlockId> {
        let alloc_size = allocation_size(rounded);
        if let Some(id) = self.find_free_block(pool, rounded) {
            return Some(id);
        }
        if self.config.garbage_collection_threshold > 0.0 {
            self.garbage_collect_cached_blocks();
        }
        if let Some(id) = self.alloc_segment(pool, alloc_size) {
            return Some(id);
        }
        if self.release_available_cached_blocks(pool, rounded)
            && let Some(id) = self
                .find_free_block(pool, rounded)
                .or_else(|| self.alloc_segment(pool, alloc_size))
        {
            return Some(id);
        }
        self.release_cached_blocks();
        self.stats.num_alloc_retries += 1;
        self.find_free_block(pool, rounded)
            .or_else(|| self.alloc_segment(pool, alloc_size))
    }

    /// Best fit with PyTorch's oversize rules; removes the block from its pool.
    fn find_free_block(&mut self, pool: Pool, rounded: u64) -> Option<BlockId> {
        self.searches[pool_slot(pool)] += 1;
        let max_split = self.config.max_split_size;
        let slack = self.config.max_non_split_rounding;
        // Candidates come smallest first, so once one is rejected by a size rule every later
        // one would be too: the first candidate decides.
        let id = self.blocks.candidates(pool, rounded).next()?;
        let block_size = self.blocks.get(id).size;
        if rounded < max_split && block_size >= max_split {
            return None;
        }
        if rounded >= max_split && block_size >= rounded.saturating_add(slack) {
            return None;
        }
        self.blocks.pool_remove(id);
        Some(id)
    }

    /// Reserves a new segment if the capacity allows; returns its single (free, unpooled) block.
    fn alloc_segment(&mut self, pool: Pool, size: u64) -> Option<BlockId> {
        if self.reserved() + size > self.capacity {
            return None;
        }
        let addr = self.source.allocate(size).ok()?;
        let ordinal = self.blocks.next_ordinal();
        let id = self
            .blocks
            .insert(Block::whole_segment(addr, size, pool, false, ordinal));
        self.segments.insert(
            addr,
            Segment {
                addr,
                size,
                pool,
                first: id,
                pages: None,
            },
        );
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.trace
            .record(TraceAction::SegmentAlloc, addr, size, None);
        Some(id)
    }

    /// PyTorch's `should_split`.
    fn should_split(&self, block: &Block, rounded: u64) -> bool {
        let remaining = block.size - rounded;
        if block.pool == Pool::Small || self.config.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            rounded < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Hands out block `id` (already out of its pool), splitting off the remainder if allowed.
    fn alloc_found_block(
        &mut self,
        id: BlockId,
        rounded: u64,
        requested: u64,
        category: Category,
        name: Option<Arc<str>>,
    ) -> Allocation {
        let before = self.inactive_split_of(id);
        let mut involved_after = vec![id];
        if self.should_split(self.blocks.get(id), rounded) {
            involved_after.push(self.blocks.split_front(id, rounded));
        }
        let pool = self.blocks.get(id).pool;
        {
            let b = self.blocks.get_mut(id);
            b.allocated = true;
            b.requested = requested;
            b.category = category;
            b.name = name.clone();
        }
        let after = involved_after
            .iter()
            .map(|&i| self.inactive_split_of(i))
            .fold((0, 0), add_pair);
        self.stats.inactive_split.change(pool, after.0 - before.0);
        self.stats
            .inactive_split_bytes
            .change(pool, after.1 - before.1);

        let (addr, size) = (self.blocks.get(id).addr, self.blocks.get(id).size);
        self.live.insert(addr, id);
        self.count_alloc(pool, addr, size, requested, category, name)
    }

    /// Returns the block at `addr` to its pool, merging it with free neighbours.
    pub fn free(&mut self, addr: u64) -> Result<(), InvalidFree> {
        if let Some(r) = self.recorder.as_mut() {
            r.on_free(addr);
        }
        if self.free_planned(addr) {
            return Ok(());
        }
        let id = self.live.remove(&addr).ok_or(InvalidFree { addr })?;
        let (pool, size, requested, category, name) = {
            let b = self.blocks.get_mut(id);
            b.allocated = false;
            (b.pool, b.size, b.requested, b.category, b.name.take())
        };
        let tag = self.count_free_requested(pool, addr, size, requested, category, name);

        // free_block: merge with free neighbours, return to the pool.
        let mut before = (0, 0);
        let neighbours = [self.blocks.get(id).prev, self.blocks.get(id).next];
        for n in neighbours.into_iter().flatten() {
            if !self.blocks.get(n).allocated {
                before = add_pair(before, self.inactive_split_of(n));
                self.blocks.merge(id, n);
            }
        }
        {
            let gc_base = self.searches[pool_slot(pool)];
            let b = self.blocks.get_mut(id);
            b.requested = 0;
            b.category = Category::Other;
            b.gc_base = gc_base;
            if b.prev.is_none() {
                let segment = b.segment;
                self.segments
                    .get_mut(&segment)
                    .expect("segment of a block")
                    .first = id;
            }
        }
        self.blocks.pool_insert(id);
        let after = self.inactive_split_of(id);
        self.stats.inactive_split.change(pool, after.0 - before.0);
        self.stats
            .inactive_split_bytes
            .change(pool, after.1 - before.1);
        self.count_free_completed(pool, addr, size, requested, tag);
        Ok(())
    }

    /// `(count, bytes)` a block contributes to `inactive_split`: free, in a split segment, and
    /// not part of an expandable segment.
    fn inactive_split_of(&self, id: BlockId) -> (i64, i64) {
        let b = self.blocks.get(id);
        let split = b.prev.is_some() || b.next.is_some();
        let expandable = self
            .segments
            .get(&b.segment)
            .is_some_and(|s| s.pages.is_some());
        if !b.allocated && split && !expandable {
            (1, b.size as i64)
        } else {
            (0, 0)
        }
    }

    /// Records an OOM (its trace entry holds the rounded request, as PyTorch's does) and builds
    /// its error (which reports the segment size, as PyTorch's message does).
    fn out_of_memory(
        &mut self,
        requested: u64,
        rounded: u64,
        alloc_size: u64,
        name: Option<Arc<str>>,
    ) -> OutOfMemory {
        self.stats.num_ooms += 1;
        let free = self.capacity.saturating_sub(self.reserved());
        self.trace.record(TraceAction::Oom, free, rounded, None);
        OutOfMemory {
            requested,
            alloc_size,
            capacity: self.capacity,
            free,
            allocated: self.allocated(),
            reserved: self.reserved(),
            expandable_segments: self.config.expandable_segments,
            by_category: Box::new(self.stats.current_category_bytes()),
            name: name.map(|n| n.to_string()),
            device: self.device_name.clone(),
        }
    }

    /// Allocated bytes per category right now.
    pub fn category_bytes(&self) -> CategoryBytes {
        self.stats.current_category_bytes()
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        for seg in std::mem::take(&mut self.segments).into_values() {
            if seg.pages.is_some() {
                self.source.release(seg.addr, seg.size);
            } else {
                self.source.free(seg.addr, seg.size);
            }
        }
    }
}

pub(crate) fn pool_slot(pool: Pool) -> usize {
    match pool {
        Pool::Small => 0,
        Pool::Large => 1,
    }
}

fn add_pair(a: (i64, i64), b: (i64, i64)) -> (i64, i64) {
    (a.0 + b.0, a.1 + b.1)
}
