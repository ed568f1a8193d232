//! ZeRO-1 on flat buffers: each block's flat buffer is cut into `world` equal shards (the last
//! padded), rank r owns shard r — its optimizer state and its fp32 master weights — updates
//! only those elements, and the updated parameters are gathered back into every rank's full
//! copy (Rajbhandari et al. 2020, "ZeRO", stage 1: optimizer states, and with them the master
//! weights, partitioned over the data-parallel group).
//!
//! Not for: the update rule (the optimizer) or the gradients' reduction (`step`).

use std::ops::Range;

/// Rank `rank`'s elements of a flat buffer of `numel` split over `world` ranks, and the shard
/// length every rank pads to (so all-gathers are of equal parts).
pub fn shard_of(numel: usize, rank: usize, world: usize) -> (Range<usize>, usize) {
    let len = numel.div_ceil(world.max(1));
    let start = (rank * len).min(numel);
    (start..(start + len).min(numel), len)
}

/// The weights' element ranges that fall inside `shard`, relative to the shard's start.
pub fn ranges_within(ranges: &[Range<usize>], shard: &Range<usize>) -> Vec<Range<usize>> {
    ranges
        .iter()
        .filter_map(|r| {
            let (lo, hi) = (r.start.max(shard.start), r.end.min(shard.end));
            (lo < hi).then(|| lo - shard.start..hi - shard.start)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_buffer_once_and_pad_the_last() {
        // 10 elements over 3 ranks: shards of 4, the last holding 2 (padded to 4).
        assert_eq!(shard_of(10, 0, 3), (0..4, 4));
        assert_eq!(shard_of(10, 1, 3), (4..8, 4));
        assert_eq!(shard_of(10, 2, 3), (8..10, 4));
        // More ranks than elements: the extra ranks own nothing.
        assert_eq!(shard_of(2, 3, 4), (2..2, 1));
        for (numel, world) in [(1, 1), (7, 2), (12, 4), (1000, 7)] {
            let covered: usize = (0..world).map(|r| shard_of(numel, r, world).0.len()).sum();
            assert_eq!(covered, numel);
        }
    }

    #[test]
    fn weight_ranges_are_cut_to_the_shard() {
        let ranges = [0..3, 3..9, 9..10];
        assert_eq!(ranges_within(&ranges, &(4..8)), vec![0..4]);
        assert_eq!(ranges_within(&ranges, &(2..10)), vec![0..1, 1..7, 7..8]);
    }
}
