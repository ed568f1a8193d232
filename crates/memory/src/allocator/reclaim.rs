//! Giving cached memory back to the segment source: `empty_cache()` (release every unsplit
//! cached segment and every fully free expandable page), PyTorch's garbage collection of old
//! cached large blocks, and the release of cached oversize blocks when `max_split_size` is set.
//!
//! Not for: the order in which these run on the allocation path (see `mod.rs`).

use super::blocks::BlockId;
use super::{CachingAllocator, pool_slot};
use crate::rounding::Pool;
use crate::trace::TraceAction;

impl CachingAllocator {
    /// `empty_cache()`: releases every cached segment that holds no allocation, and unmaps the
    /// fully free pages of expandable segments. Split segments' free blocks stay (they are
    /// "non-releasable memory").
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    pub(super) fn release_cached_blocks(&mut self) {
        self.stats.num_sync_all_streams += 1;
        for pool in Pool::BOTH {
            for id in self.blocks.free_ids(pool) {
                if self.blocks.is_whole_segment(id) && !self.is_expandable_block(id) {
                    self.release_segment(id);
                }
            }
        }
        self.unmap_free_pages();
    }

    fn is_expandable_block(&self, id: BlockId) -> bool {
        self.blocks.get(id).expandable
    }

    /// Returns the whole-segment free block `id` to the source.
    pub(super) fn release_segment(&mut self, id: BlockId) {
        self.blocks.pool_remove(id);
        let block = self.blocks.remove(id);
        let seg = self
            .segments
            .remove(&block.segment)
            .expect("segment of a free block");
        self.source.free(seg.addr, seg.size);
        self.stats.segment.decrease(seg.pool, 1);
        self.stats.reserved_bytes.decrease(seg.pool, seg.size);
        if seg.size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        self.trace
            .record(TraceAction::SegmentFree, seg.addr, seg.size, None);
    }

    /// PyTorch's `garbage_collect_cached_blocks`: while reserved bytes exceed
    /// `threshold × capacity`, release the unsplit cached large-pool blocks at least as old as
    /// the average age; stop when the target is met or a round frees nothing.
    pub(super) fn garbage_collect_cached_blocks(&mut self) {
        let threshold = (self.config.garbage_collection_threshold * self.capacity as f64) as u64;
        if self.reserved() <= threshold {
            return;
        }
        let target = self.reserved() - threshold;
        let now = self.searches[pool_slot(Pool::Large)];
        let mut freed = 0u64;
        loop {
            let reclaimable: Vec<(BlockId, u64)> = self
                .blocks
                .free_ids(Pool::Large)
                .into_iter()
                .filter(|&id| self.blocks.is_whole_segment(id) && !self.is_expandable_block(id))
                .map(|id| (id, now - self.blocks.get(id).gc_base))
                .collect();
            if reclaimable.is_empty() {
                return;
            }
            let average = reclaimable.iter().map(|&(_, age)| age as f64).sum::<f64>()
                / reclaimable.len() as f64;
            let mut freed_this_round = false;
            for (id, age) in reclaimable {
                if age as f64 >= average {
                    freed += self.blocks.get(id).size;
                    self.release_segment(id);
                    freed_this_round = true;
                    if freed >= target {
                        return;
                    }
                }
            }
            if !freed_this_round {
                return;
            }
        }
    }

    /// PyTorch's `release_available_cached_blocks` (only with `max_split_size` set): release the
    /// smallest cached oversize block of at least `max(size, max_split_size)`, or else oversize
    /// blocks from the largest down until they cover that size. Returns whether it released.
    pub(super) fn release_available_cached_blocks(&mut self, pool: Pool, rounded: u64) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key = rounded.max(max_split);
        let single = self
            .blocks
            .candidates(pool, key)
            .find(|&id| !self.is_expandable_block(id));
        if let Some(id) = single {
            self.release_segment(id);
            return true;
        }
        let oversize: Vec<BlockId> = self
            .blocks
            .free_desc(pool)
            .take_while(|&id| self.blocks.get(id).size >= max_split)
            .filter(|&id| !self.is_expandable_block(id))
            .collect();
        let mut released = 0;
        for id in oversize {
            if released >= key {
                break;
            }
            released += self.blocks.get(id).size;
            self.release_segment(id);
        }
        released >= key
    }
}
