//! PyTorch's size rules: request rounding, pool choice and segment sizes
//! (`round_size`, `get_allocation_size` in c10/cuda/CUDACachingAllocator.cpp).
//!
//! Not for: deciding whether a cached block may be split or reused (see `allocator::blocks`).

use crate::size::MIB;
use serde::Serialize;

/// Every request is rounded up to a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Rounded requests up to this size go to the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = MIB;
/// Segment size of the small pool (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Large requests below this share a [`LARGE_BUFFER`] segment (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Shared large segment size; also the oversize-reuse slack (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Large segments are rounded up to a multiple of this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 * MIB;
/// Requests of this size or more are refused outright, as PyTorch does ("more than 1EB").
pub const MAX_REQUEST: u64 = 1 << 60;

/// The two block pools of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    Small,
    Large,
}

impl Pool {
    pub const BOTH: [Pool; 2] = [Pool::Large, Pool::Small];

    /// The pool a rounded size belongs to: exactly 1 MiB is still small.
    pub fn for_size(rounded: u64) -> Pool {
        if rounded <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        }
    }

    /// PyTorch's name in stat keys (`small_pool`, `large_pool`).
    pub fn stat_name(self) -> &'static str {
        match self {
            Pool::Small => "small_pool",
            Pool::Large => "large_pool",
        }
    }

    /// PyTorch's `segment_type` in snapshots.
    pub fn segment_type(self) -> &'static str {
        match self {
            Pool::Small => "small",
            Pool::Large => "large",
        }
    }

    /// Page size of an expandable segment of this pool.
    pub fn expandable_page_size(self) -> u64 {
        match self {
            Pool::Small => SMALL_BUFFER,
            Pool::Large => LARGE_BUFFER,
        }
    }
}

/// Rounds a request: at least 512 B, a multiple of 512 B, or the next of `divisions` equal steps
/// between the surrounding powers of two when power-of-two divisions are configured for the size.
pub fn round_size(size: u64, divisions: u32) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    if divisions > 1 && size > MIN_BLOCK_SIZE * divisions as u64 {
        return roundup_power2_next_division(size, divisions as u64);
    }
    size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
}

fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = (floor / divisions).max(1);
    floor + (size - floor).div_ceil(step) * step
}

/// Size of the segment to reserve for a rounded request when no cached block fits.
pub fn allocation_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_to_512() {
        assert_eq!(round_size(1, 0), 512);
        assert_eq!(round_size(512, 0), 512);
        assert_eq!(round_size(513, 0), 1024);
        assert_eq!(round_size(5 * MIB + 1, 0), 5 * MIB + 512);
    }

    #[test]
    fn power2_divisions_follow_the_documented_example() {
        // PyTorch's round_size applies divisions only above 512 × divisions, so 1200 with 4
        // divisions (≤ 2048) keeps 512-rounding: 1536. (The docs' "1200 → 1280" example
        // disagrees with the code; we follow the code.)
        assert_eq!(round_size(1200, 4), 1536);
        // 3000 with 4 divisions: steps between 2048 and 4096 are 2048, 2560, 3072, 3584 → 3072.
        assert_eq!(round_size(3000, 4), 3072);
        assert_eq!(round_size(2049, 4), 2560);
        // Exact powers of two stay.
        assert_eq!(round_size(4 * MIB, 4), 4 * MIB);
        // 5 MiB + 1 with 4 divisions: between 4 and 8 MiB in 1 MiB steps → 6 MiB.
        assert_eq!(round_size(5 * MIB + 1, 4), 6 * MIB);
    }

    #[test]
    fn pools_and_segment_sizes_follow_pytorch() {
        assert_eq!(Pool::for_size(MIB), Pool::Small);
        assert_eq!(Pool::for_size(MIB + 512), Pool::Large);
        assert_eq!(allocation_size(512), 2 * MIB);
        assert_eq!(allocation_size(MIB), 2 * MIB);
        assert_eq!(allocation_size(5 * MIB), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB), 10 * MIB);
        assert_eq!(allocation_size(11 * MIB), 12 * MIB);
        assert_eq!(allocation_size(11 * MIB + 512), 12 * MIB);
    }
}
