//! Expandable segments: one growable address range per pool whose pages (2 MiB in the small
//! pool, 20 MiB in the large) are backed only while needed (PyTorch's "Note [Expandable
//! Segments]"). Free space merges across the whole range, so freed bytes serve requests of any
//! size; on pressure, fully free pages anywhere in the range are unmapped and the search runs
//! again. A best-fit candidate whose pages cannot be backed within the capacity does not end
//! the search: the next candidate is tried.
//!
//! Not for: fixed-size segments (see `mod.rs`).

use super::blocks::{Block, BlockId, PageMap, Segment};
use super::{CachingAllocator, pool_slot};
use crate::rounding::Pool;
use crate::trace::TraceAction;

impl CachingAllocator {
    /// Allocation path in expandable mode: search → unmap all free pages and search again
    /// (a counted retry) → OOM.
    pub(super) fn malloc_expandable(&mut self, pool: Pool, rounded: u64) -> Option<BlockId> {
        self.ensure_expandable_segment(pool)?;
        for attempt in 0..2 {
            self.searches[pool_slot(pool)] += 1;
            if let Some(id) = self.find_backable_block(pool, rounded) {
                if self.map_pages_for(id, rounded) {
                    return Some(id);
                }
                self.blocks.pool_insert(id);
            }
            if attempt == 0 {
                self.release_cached_blocks();
                self.stats.num_alloc_retries += 1;
            }
        }
        None
    }

    /// Reserves the pool's address range on first use: 1.125 × capacity, as PyTorch does.
    fn ensure_expandable_segment(&mut self, pool: Pool) -> Option<()> {
        if self.expandable[pool_slot(pool)].is_some() {
            return Some(());
        }
        let page = pool.expandable_page_size();
        let pages = ((self.capacity as u128 * 9 / 8).div_ceil(page as u128) as u64).max(1);
        let size = pages.checked_mul(page)?;
        let addr = self.source.reserve(size).ok()?;
        let ordinal = self.blocks.next_ordinal();
        let id = self
            .blocks
            .insert(Block::whole_segment(addr, size, pool, true, ordinal));
        self.blocks.pool_insert(id);
        let pages = PageMap {
            page_size: page,
            mapped: vec![false; pages as usize],
        };
        self.segments.insert(
            addr,
            Segment {
                addr,
                size,
                pool,
                first: id,
                pages: Some(pages),
            },
        );
        self.expandable[pool_slot(pool)] = Some(addr);
        Some(())
    }

    /// Bytes that would have to be mapped to place `size` bytes at the start of block `id`.
    fn mapping_cost(&self, id: BlockId, size: u64) -> u64 {
        let b = self.blocks.get(id);
        let seg = &self.segments[&b.segment];
        let pages = seg.pages.as_ref().expect("expandable segment");
        let unmapped = pages.mapped[pages.pages(seg.addr, b.addr, size)]
            .iter()
            .filter(|m| !**m)
            .count() as u64;
        unmapped * pages.page_size
    }

    /// Smallest free block that fits and whose missing pages fit within the capacity.
    fn find_backable_block(&mut self, pool: Pool, rounded: u64) -> Option<BlockId> {
        let headroom = self.capacity.saturating_sub(self.reserved());
        let id = self
            .blocks
            .candidates(pool, rounded)
            .find(|&id| self.mapping_cost(id, rounded) <= headroom)?;
        self.blocks.pool_remove(id);
        Some(id)
    }

    /// Maps the unmapped pages under `[block.addr, block.addr + size)`. False if the source fails.
    fn map_pages_for(&mut self, id: BlockId, size: u64) -> bool {
        let (seg_addr, addr) = {
            let b = self.blocks.get(id);
            (b.segment, b.addr)
        };
        let seg = self
            .segments
            .get_mut(&seg_addr)
            .expect("expandable segment");
        let pool = seg.pool;
        let pages = seg.pages.as_mut().expect("expandable segment");
        let range = pages.pages(seg.addr, addr, size);
        if pages.mapped[range.clone()].iter().all(|m| *m) {
            return true;
        }
        let runs_before = pages.mapped_runs();
        let mut runs = Vec::new();
        let mut i = range.start;
        while i < range.end {
            if pages.mapped[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < range.end && !pages.mapped[i] {
                i += 1;
            }
            runs.push((start, i));
        }
        let page = pages.page_size;
        for &(start, end) in &runs {
            let (run_addr, run_len) = (seg.addr + start as u64 * page, (end - start) as u64 * page);
            if self.source.map(run_addr, run_len).is_err() {
                return false;
            }
            pages.mapped[start..end].iter_mut().for_each(|m| *m = true);
            self.stats.reserved_bytes.increase(pool, run_len);
            self.stats.num_device_alloc += 1;
            self.trace
                .record(TraceAction::SegmentMap, run_addr, run_len, None);
        }
        let runs_after = pages.mapped_runs();
        self.stats
            .segment
            .change(pool, runs_after as i64 - runs_before as i64);
        true
    }

    /// Unmaps every mapped page that no allocated block touches, in all expandable segments.
    pub(super) fn unmap_free_pages(&mut self) {
        for slot in self.expandable {
            let Some(seg_addr) = slot else { continue };
            let (first, base, pool) = {
                let seg = &self.segments[&seg_addr];
                (seg.first, seg.addr, seg.pool)
            };
            let page_count = self.segments[&seg_addr]
                .pages
                .as_ref()
                .map_or(0, |p| p.mapped.len());
            let mut in_use = vec![false; page_count];
            {
                let pages = self.segments[&seg_addr]
                    .pages
                    .as_ref()
                    .expect("expandable segment");
                for id in self.blocks.segment_blocks(first) {
                    let b = self.blocks.get(id);
                    if b.allocated {
                        in_use[pages.pages(base, b.addr, b.size)]
                            .iter_mut()
                            .for_each(|u| *u = true);
                    }
                }
            }
            let seg = self
                .segments
                .get_mut(&seg_addr)
                .expect("expandable segment");
            let pages = seg.pages.as_mut().expect("expandable segment");
            let runs_before = pages.mapped_runs();
            let page = pages.page_size;
            let mut i = 0;
            while i < page_count {
                if !pages.mapped[i] || in_use[i] {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < page_count && pages.mapped[i] && !in_use[i] {
                    pages.mapped[i] = false;
                    i += 1;
                }
                let (run_addr, run_len) = (base + start as u64 * page, (i - start) as u64 * page);
                self.source.unmap(run_addr, run_len);
                self.stats.reserved_bytes.decrease(pool, run_len);
                self.stats.num_device_free += 1;
                self.trace
                    .record(TraceAction::SegmentUnmap, run_addr, run_len, None);
            }
            let runs_after = pages.mapped_runs();
            self.stats
                .segment
                .change(pool, runs_after as i64 - runs_before as i64);
        }
    }
}
