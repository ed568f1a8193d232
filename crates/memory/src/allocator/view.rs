//! Read-only views of the allocator's state: segments with their blocks, as PyTorch's
//! `memory_snapshot()` lists them (one segment per contiguous mapped range for expandable
//! segments), which the snapshot export, the fragmentation figures and the summary read.
//!
//! Not for: changing state.

use super::CachingAllocator;
use crate::category::Category;
use crate::rounding::Pool;
use serde::Serialize;
use std::sync::Arc;

/// State of a block in a snapshot (PyTorch's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    ActiveAllocated,
    Inactive,
}

impl BlockState {
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block as a snapshot shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockView {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<Category>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
}

/// One segment as a snapshot shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SegmentView {
    pub address: u64,
    pub total_size: u64,
    pub pool: Pool,
    pub is_expandable: bool,
    pub blocks: Vec<BlockView>,
}

impl SegmentView {
    pub fn allocated_size(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum()
    }

    pub fn requested_size(&self) -> u64 {
        self.blocks.iter().map(|b| b.requested_size).sum()
    }
}

impl CachingAllocator {
    /// Segments in address order with their blocks; expandable segments appear as one segment
    /// per contiguous mapped range, free blocks clipped to it.
    pub fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for seg in self.segments.values() {
            let blocks: Vec<BlockView> = self
                .blocks
                .segment_blocks(seg.first)
                .map(|id| {
                    let b = self.blocks.get(id);
                    BlockView {
                        address: b.addr,
                        size: b.size,
                        requested_size: if b.allocated { b.requested } else { 0 },
                        state: if b.allocated {
                            BlockState::ActiveAllocated
                        } else {
                            BlockState::Inactive
                        },
                        category: b.allocated.then_some(b.category),
                        name: if b.allocated { b.name.clone() } else { None },
                    }
                })
                .collect();
            match &seg.pages {
                None => out.push(SegmentView {
                    address: seg.addr,
                    total_size: seg.size,
                    pool: seg.pool,
                    is_expandable: false,
                    blocks,
                }),
                Some(pages) => {
                    let page = pages.page_size;
                    let mut i = 0;
                    while i < pages.mapped.len() {
                        if !pages.mapped[i] {
                            i += 1;
                            continue;
                        }
                        let start = i;
                        while i < pages.mapped.len() && pages.mapped[i] {
                            i += 1;
                        }
                        let (lo, hi) = (seg.addr + start as u64 * page, seg.addr + i as u64 * page);
                        let clipped = blocks
                            .iter()
                            .filter(|b| b.address < hi && b.address + b.size > lo)
                            .map(|b| {
                                let a = b.address.max(lo);
                                let e = (b.address + b.size).min(hi);
                                BlockView {
                                    address: a,
                                    size: e - a,
                                    ..b.clone()
                                }
                            })
                            .collect();
                        out.push(SegmentView {
                            address: lo,
                            total_size: hi - lo,
                            pool: seg.pool,
                            is_expandable: true,
                            blocks: clipped,
                        });
                    }
                }
            }
        }
        if let Some(arena) = self.arena_view() {
            let at = out.partition_point(|s| s.address < arena.address);
            out.insert(at, arena);
        }
        out
    }
}
