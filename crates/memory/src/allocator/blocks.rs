//! Blocks and segments: the address-ordered list of blocks carved from each segment, the free
//! pools ordered by (size, segment, address) for best fit, splitting and merging of free
//! neighbours, and the `inactive_split` accounting that follows from them.
//!
//! Why ties go to the oldest segment rather than the lowest address: a dry run's virtual source
//! hands out rising addresses, while the host source's `mmap` places each new segment wherever
//! the kernel likes (usually below the last one). Ordering equal-size blocks by the segment's
//! creation number, then by address inside it, makes the best fit (and so every later split,
//! merge and peak) the same on both, whatever the addresses; on a CUDA device, whose
//! allocations mostly rise, it is PyTorch's (size, address) order.
//!
//! Not for: the decision of when to reserve or release segments (see `mod.rs`, `reclaim.rs`).

use crate::category::Category;
use crate::rounding::Pool;
use std::collections::BTreeSet;
use std::sync::Arc;

pub(crate) type BlockId = u32;

/// A block of a segment: handed out (allocated) or cached (free).
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub addr: u64,
    pub size: u64,
    /// The caller's unrounded size while allocated.
    pub requested: u64,
    pub pool: Pool,
    /// Address of the owning segment (key of `Segments`).
    pub segment: u64,
    /// Creation number of the owning segment (the free pools' tie-break).
    pub ordinal: u64,
    pub prev: Option<BlockId>,
    pub next: Option<BlockId>,
    pub allocated: bool,
    /// Part of an expandable segment (excluded from `inactive_split`, never released whole).
    pub expandable: bool,
    pub category: Category,
    pub name: Option<Arc<str>>,
    /// Value of the pool's search counter when the block became free (garbage-collection age).
    pub gc_base: u64,
}

impl Block {
    /// The single free block spanning a new segment (or a new expandable range).
    pub fn whole_segment(
        addr: u64,
        size: u64,
        pool: Pool,
        expandable: bool,
        ordinal: u64,
    ) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            pool,
            segment: addr,
            ordinal,
            prev: None,
            next: None,
            allocated: false,
            expandable,
            category: Category::Other,
            name: None,
            gc_base: 0,
        }
    }
}

/// Pages of an expandable segment: which are backed by memory.
#[derive(Debug, Clone)]
pub(crate) struct PageMap {
    pub page_size: u64,
    pub mapped: Vec<bool>,
}

impl PageMap {
    /// Page indices touched by `[addr, addr + size)` relative to `base`.
    pub fn pages(&self, base: u64, addr: u64, size: u64) -> std::ops::Range<usize> {
        let first = ((addr - base) / self.page_size) as usize;
        let last = ((addr - base + size).div_ceil(self.page_size)) as usize;
        first..last.min(self.mapped.len())
    }

    /// Number of maximal runs of mapped pages (each is one segment in snapshots).
    pub fn mapped_runs(&self) -> u64 {
        let mut runs = 0;
        let mut prev = false;
        for &m in &self.mapped {
            if m && !prev {
                runs += 1;
            }
            prev = m;
        }
        runs
    }
}

/// One reservation from the segment source.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub addr: u64,
    pub size: u64,
    pub pool: Pool,
    pub first: BlockId,
    /// Present for expandable segments.
    pub pages: Option<PageMap>,
}

/// Arena of blocks plus the two free pools.
#[derive(Debug, Default)]
pub(crate) struct Blocks {
    slots: Vec<Option<Block>>,
    vacant: Vec<BlockId>,
    /// Free blocks per pool, ordered by (size, segment ordinal, address): best fit is a range
    /// query.
    free: [BTreeSet<FreeKey>; 2],
    /// Segments created so far (the next segment's ordinal).
    segments_made: u64,
}

type FreeKey = (u64, u64, u64, BlockId);

fn pool_index(pool: Pool) -> usize {
    match pool {
        Pool::Small => 0,
        Pool::Large => 1,
    }
}

impl Blocks {
    /// The ordinal for a new segment: 0, 1, 2, … in creation order.
    pub fn next_ordinal(&mut self) -> u64 {
        self.segments_made += 1;
        self.segments_made - 1
    }

    fn key(&self, id: BlockId) -> FreeKey {
        let b = self.get(id);
        (b.size, b.ordinal, b.addr, id)
    }

    pub fn get(&self, id: BlockId) -> &Block {
        self.slots[id as usize].as_ref().expect("live block id")
    }

    pub fn get_mut(&mut self, id: BlockId) -> &mut Block {
        self.slots[id as usize].as_mut().expect("live block id")
    }

    pub fn insert(&mut self, block: Block) -> BlockId {
        if let Some(id) = self.vacant.pop() {
            self.slots[id as usize] = Some(block);
            id
        } else {
            self.slots.push(Some(block));
            (self.slots.len() - 1) as BlockId
        }
    }

    pub fn remove(&mut self, id: BlockId) -> Block {
        let block = self.slots[id as usize].take().expect("live block id");
        self.vacant.push(id);
        block
    }

    /// Adds a free block to its pool.
    pub fn pool_insert(&mut self, id: BlockId) {
        let (key, pool) = (self.key(id), pool_index(self.get(id).pool));
        self.free[pool].insert(key);
    }

    /// Takes a free block out of its pool.
    pub fn pool_remove(&mut self, id: BlockId) {
        let (key, pool) = (self.key(id), pool_index(self.get(id).pool));
        let removed = self.free[pool].remove(&key);
        debug_assert!(removed, "free block missing from its pool");
    }

    /// Free blocks of `pool` of at least `size` bytes, smallest first, oldest segment and then
    /// lowest address on ties.
    pub fn candidates(&self, pool: Pool, size: u64) -> impl Iterator<Item = BlockId> + '_ {
        self.free[pool_index(pool)]
            .range((size, 0, 0, 0)..)
            .map(|&(_, _, _, id)| id)
    }

    /// All free blocks of a pool, largest first.
    pub fn free_desc(&self, pool: Pool) -> impl Iterator<Item = BlockId> + '_ {
        self.free[pool_index(pool)]
            .iter()
            .rev()
            .map(|&(_, _, _, id)| id)
    }

    /// Whether the block is alone in its segment (an unsplit segment).
    pub fn is_whole_segment(&self, id: BlockId) -> bool {
        let b = self.get(id);
        b.prev.is_none() && b.next.is_none()
    }

    /// Splits `size` bytes off the front of free block `id`; the remainder becomes a new free
    /// block (inserted in the pool) right after it. Returns the remainder's id.
    pub fn split_front(&mut self, id: BlockId, size: u64) -> BlockId {
        let (rest, next) = {
            let b = self.get(id);
            let rest = Block {
                addr: b.addr + size,
                size: b.size - size,
                requested: 0,
                pool: b.pool,
                segment: b.segment,
                ordinal: b.ordinal,
                prev: Some(id),
                next: b.next,
                allocated: false,
                expandable: b.expandable,
                category: Category::Other,
                name: None,
                gc_base: b.gc_base,
            };
            (rest, b.next)
        };
        let rest_id = self.insert(rest);
        if let Some(n) = next {
            self.get_mut(n).prev = Some(rest_id);
        }
        let b = self.get_mut(id);
        b.size = size;
        b.next = Some(rest_id);
        self.pool_insert(rest_id);
        rest_id
    }

    /// Merges free neighbour `other` (which must be `id`'s prev or next and not allocated) into
    /// `id`, removing `other` from its pool and the arena. Returns the merged-away block.
    pub fn merge(&mut self, id: BlockId, other: BlockId) -> Block {
        self.pool_remove(other);
        let o = self.remove(other);
        let b = self.get_mut(id);
        if o.next == Some(id) {
            b.addr = o.addr;
            b.prev = o.prev;
            b.size += o.size;
            if let Some(p) = o.prev {
                self.get_mut(p).next = Some(id);
            }
        } else {
            b.next = o.next;
            b.size += o.size;
            if let Some(n) = o.next {
                self.get_mut(n).prev = Some(id);
            }
        }
        o
    }

    /// Blocks of a segment in address order.
    pub fn segment_blocks(&self, first: BlockId) -> impl Iterator<Item = BlockId> + '_ {
        std::iter::successors(Some(first), |&id| self.get(id).next)
    }

    /// Every free block id in a pool.
    pub fn free_ids(&self, pool: Pool) -> Vec<BlockId> {
        self.free[pool_index(pool)]
            .iter()
            .map(|&(_, _, _, id)| id)
            .collect()
    }
}
