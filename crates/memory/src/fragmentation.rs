//! Fragmentation figures PyTorch lacks as single numbers (pytorch/pytorch#29554): rounding
//! waste, cached-but-unallocated bytes, non-releasable bytes, the largest free block and its
//! share of all free cached bytes.
//!
//! Not for: deciding anything; these are observations.

use crate::allocator::{BlockState, CachingAllocator};
use serde::Serialize;

/// Fragmentation of a device's cache at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Fragmentation {
    /// allocated − requested: bytes lost to rounding and unsplit slack ("internal" free).
    pub rounding_waste_bytes: u64,
    /// reserved − allocated: cached bytes no tensor uses ("external" free).
    pub cached_unallocated_bytes: u64,
    /// Free bytes in split segments, which `empty_cache` cannot release.
    pub non_releasable_bytes: u64,
    /// The largest request that cached memory could serve without reserving more.
    pub largest_free_block_bytes: u64,
    /// largest free block / all cached free bytes (1.0 = one contiguous hole, or nothing free).
    pub largest_free_ratio: f64,
    /// peak reserved / peak allocated (1.0 = no overhead at the peak).
    pub peak_reserved_over_allocated: f64,
}

impl Fragmentation {
    pub fn of(allocator: &CachingAllocator) -> Fragmentation {
        let stats = allocator.stats();
        let allocated = stats.allocated_bytes.all.current as u64;
        let requested = stats.requested_bytes.all.current as u64;
        let reserved = stats.reserved_bytes.all.current as u64;
        let segments = allocator.segments();
        let free_blocks = segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::Inactive);
        let (largest, total_free) =
            free_blocks.fold((0u64, 0u64), |(l, t), b| (l.max(b.size), t + b.size));
        let peak_alloc = stats.allocated_bytes.all.peak as f64;
        Fragmentation {
            rounding_waste_bytes: allocated.saturating_sub(requested),
            cached_unallocated_bytes: reserved.saturating_sub(allocated),
            non_releasable_bytes: stats.inactive_split_bytes.all.current as u64,
            largest_free_block_bytes: largest,
            largest_free_ratio: if total_free == 0 {
                1.0
            } else {
                largest as f64 / total_free as f64
            },
            peak_reserved_over_allocated: if peak_alloc == 0.0 {
                1.0
            } else {
                stats.reserved_bytes.all.peak as f64 / peak_alloc
            },
        }
    }
}
