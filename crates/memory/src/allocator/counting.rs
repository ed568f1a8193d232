//! The bookkeeping every hand-out and free shares, whether the block came from the caching
//! pools or the planned arena: PyTorch's statistics, the per-category bytes and their peak, the
//! open measurement window and the trace.
//!
//! Not for: choosing blocks (see `mod.rs`, `expandable`, `planned`).

use super::{Allocation, CachingAllocator};
use crate::category::Category;
use crate::rounding::Pool;
use crate::trace::TraceAction;
use std::sync::Arc;

impl CachingAllocator {
    /// The statistics, window and trace of handing out `size` bytes at `addr`.
    pub(super) fn count_alloc(
        &mut self,
        pool: Pool,
        addr: u64,
        size: u64,
        requested: u64,
        category: Category,
        name: Option<Arc<str>>,
    ) -> Allocation {
        let old_peak = self.stats.allocated_bytes.all.peak;
        self.stats.allocation.increase(pool, 1);
        self.stats.allocated_bytes.increase(pool, size);
        self.stats.active.increase(pool, 1);
        self.stats.active_bytes.increase(pool, size);
        self.stats.requested_bytes.increase(pool, requested);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.increase(1);
        }
        self.stats.category_bytes[category.index()].increase(size);
        if self.stats.allocated_bytes.all.current > old_peak {
            self.stats.category_bytes_at_peak = self.stats.current_category_bytes();
        }
        if let Some(w) = self.window.as_mut() {
            let stats = &self.stats;
            w.on_alloc(
                stats.allocated_bytes.all.current as u64,
                || stats.current_category_bytes(),
                category,
                name.as_ref(),
                size,
            );
        }
        self.trace
            .record(TraceAction::Alloc, addr, requested, Some((category, name)));
        Allocation {
            addr,
            size,
            requested,
        }
    }

    /// The statistics, window and trace of a free's request (PyTorch's `free`).
    pub(super) fn count_free_requested(
        &mut self,
        pool: Pool,
        addr: u64,
        size: u64,
        requested: u64,
        category: Category,
        name: Option<Arc<str>>,
    ) -> Option<(Category, Option<Arc<str>>)> {
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        self.stats.category_bytes[category.index()].decrease(size);
        if let Some(w) = self.window.as_mut() {
            w.on_free(name.as_ref(), size);
        }
        let tag = Some((category, name));
        self.trace
            .record(TraceAction::FreeRequested, addr, requested, tag.clone());
        tag
    }

    /// The statistics and trace of a free's completion (PyTorch's `free_block`).
    pub(super) fn count_free_completed(
        &mut self,
        pool: Pool,
        addr: u64,
        size: u64,
        requested: u64,
        tag: Option<(Category, Option<Arc<str>>)>,
    ) {
        self.stats.active.decrease(pool, 1);
        self.stats.active_bytes.decrease(pool, size);
        self.stats.requested_bytes.decrease(pool, requested);
        self.trace
            .record(TraceAction::FreeCompleted, addr, requested, tag);
    }
}
