//! How a flat parameter block is cut over a data-parallel group (ZeRO, Rajbhandari et al. 2020):
//! the block's `numel` elements in `world` equal shards (the last padded with zeros so that
//! collectives move equal parts), rank r owning shard r. Under ZeRO-2 and ZeRO-3 a block keeps
//! only its rank's shard of the gradient between backward passes, and under ZeRO-3 only its shard
//! of the parameters between uses; blocks built inside [`with_sharding`] are laid out so from the
//! start, so the full model never exists on one rank.
//!
//! Not for: moving the shards (the train crate's collectives) or the optimizer's sharded state.

use std::cell::Cell;
use std::ops::Range;

/// Rank `rank`'s elements of a flat buffer of `numel` split over `world` ranks, and the shard
/// length every rank pads to.
pub fn shard_range(numel: usize, rank: usize, world: usize) -> (Range<usize>, usize) {
    let len = numel.div_ceil(world.max(1));
    let start = (rank * len).min(numel);
    (start..(start + len).min(numel), len)
}

/// Which of a block's buffers are sharded, and over which group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    pub rank: usize,
    pub world: usize,
    /// ZeRO-2 and 3: the full gradient exists only while the block's backward runs.
    pub gradients: bool,
    /// ZeRO-3: the full parameters exist only while the block computes.
    pub parameters: bool,
    /// Unsharded, the full gradient starts released and takes bytes only while materialized
    /// (the optimizer step in backward).
    pub released_gradients: bool,
}

impl ShardLayout {
    /// Whether any buffer is sharded (in a group of one the shard is the whole block: ZeRO-3
    /// alone, for parameter offload).
    pub fn shards_anything(&self) -> bool {
        self.gradients || self.parameters
    }
}

thread_local! {
    static LAYOUT: Cell<Option<ShardLayout>> = const { Cell::new(None) };
}

/// Runs `f` (a model's construction) with every `ParamBlock` it builds laid out by `layout`.
pub fn with_sharding<R>(layout: ShardLayout, f: impl FnOnce() -> R) -> R {
    with_layout(Some(layout), f)
}

/// Runs `f` with no layout in force: the blocks it builds are whole and keep their gradients
/// (a LoRA base's frozen blocks, replicated on every rank).
pub(crate) fn without_sharding<R>(f: impl FnOnce() -> R) -> R {
    with_layout(None, f)
}

fn with_layout<R>(layout: Option<ShardLayout>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<ShardLayout>);
    impl Drop for Restore {
        fn drop(&mut self) {
            LAYOUT.with(|l| l.set(self.0));
        }
    }
    let _restore = Restore(LAYOUT.with(|l| l.replace(layout)));
    f()
}

/// The layout blocks built now take, if any buffer is sharded.
pub(crate) fn current_layout() -> Option<ShardLayout> {
    LAYOUT
        .with(|l| l.get())
        .filter(ShardLayout::shards_anything)
}

/// Whether blocks built now start with their full gradient released.
pub(crate) fn gradients_released() -> bool {
    LAYOUT
        .with(|l| l.get())
        .is_some_and(|l| l.released_gradients)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_buffer_once_and_pad_the_last() {
        // 10 elements over 3 ranks: shards of 4, the last holding 2 (padded to 4).
        assert_eq!(shard_range(10, 0, 3), (0..4, 4));
        assert_eq!(shard_range(10, 1, 3), (4..8, 4));
        assert_eq!(shard_range(10, 2, 3), (8..10, 4));
        // More ranks than elements: the extra ranks own nothing.
        assert_eq!(shard_range(2, 3, 4), (2..2, 1));
        for (numel, world) in [(1, 1), (7, 2), (12, 4), (1000, 7)] {
            let covered: usize = (0..world)
                .map(|r| shard_range(numel, r, world).0.len())
                .sum();
            assert_eq!(covered, numel);
        }
    }
}
