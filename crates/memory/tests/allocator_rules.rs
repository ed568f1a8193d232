//! Each caching-allocator rule pinned to values derived by hand from PyTorch's constants
//! (512 B rounding, 1 MiB small/large boundary, 2 MiB small segments, 20 MiB shared large
//! segments, 2 MiB rounding of requests ≥ 10 MiB, split rules, retry ladder).

use headroom_memory::size::MIB;
use headroom_memory::{AllocatorConfig, CachingAllocator, Category, VirtualSource};

fn allocator(capacity: u64, config: AllocatorConfig) -> CachingAllocator {
    CachingAllocator::new(capacity, config, Box::new(VirtualSource::default()))
}

fn reserved(a: &CachingAllocator) -> i64 {
    a.stats().reserved_bytes.all.current
}

#[test]
fn five_mib_request_reserves_one_20_mib_segment_and_reuses_it() {
    let mut a = allocator(1 << 40, AllocatorConfig::default());
    let x = a.malloc(5 * MIB, Category::Activation, None).unwrap();
    // 5 MiB is a large request below 10 MiB: one shared 20 MiB segment; the block is split
    // (remainder 15 MiB > 1 MiB), so allocated is exactly 5 MiB.
    assert_eq!(reserved(&a), 20 * MIB as i64);
    assert_eq!(a.stats().allocated_bytes.all.current, 5 * MIB as i64);
    assert_eq!(a.stats().segment.large_pool.current, 1);
    // The 15 MiB remainder is a free block of a split segment: non-releasable.
    assert_eq!(
        a.stats().inactive_split_bytes.large_pool.current,
        15 * MIB as i64
    );
    a.free(x.addr).unwrap();
    let y = a.malloc(5 * MIB, Category::Activation, None).unwrap();
    assert_eq!(y.addr, x.addr, "the cached block is reused");
    assert_eq!(reserved(&a), 20 * MIB as i64);
    assert_eq!(a.stats().num_device_alloc, 1);
}

#[test]
fn eleven_mib_request_reserves_twelve_mib() {
    let mut a = allocator(1 << 40, AllocatorConfig::default());
    let x = a.malloc(11 * MIB, Category::Parameter, None).unwrap();
    // ≥ 10 MiB: a dedicated segment rounded up to 2 MiB → 12 MiB; remainder 1 MiB is not
    // > 1 MiB, so the whole 12 MiB block is handed out (allocated 12 MiB, requested 11 MiB).
    assert_eq!(reserved(&a), 12 * MIB as i64);
    assert_eq!(x.size, 12 * MIB);
    assert_eq!(a.stats().allocated_bytes.all.current, 12 * MIB as i64);
    assert_eq!(a.stats().requested_bytes.all.current, 11 * MIB as i64);
}

#[test]
fn small_requests_share_a_2_mib_segment_at_512_byte_granularity() {
    let mut a = allocator(1 << 40, AllocatorConfig::default());
    let x = a.malloc(1, Category::Other, None).unwrap();
    let y = a.malloc(1000, Category::Other, None).unwrap();
    // 1 B → 512 B, 1000 B → 1024 B, carved from one 2 MiB small segment, back to back.
    assert_eq!(x.size, 512);
    assert_eq!(y.size, 1024);
    assert_eq!(y.addr, x.addr + 512);
    assert_eq!(a.stats().reserved_bytes.small_pool.current, 2 * MIB as i64);
    assert_eq!(a.stats().segment.all.current, 1);
    // Exactly 1 MiB still goes to the small pool.
    a.malloc(MIB, Category::Other, None).unwrap();
    assert_eq!(a.stats().reserved_bytes.large_pool.current, 0);
}

#[test]
fn freeing_neighbours_merges_them_back_into_one_block() {
    let mut a = allocator(1 << 40, AllocatorConfig::default());
    let x = a.malloc(512, Category::Other, None).unwrap();
    let y = a.malloc(512, Category::Other, None).unwrap();
    let z = a.malloc(512, Category::Other, None).unwrap();
    a.free(y.addr).unwrap();
    // Free y sits between x and z: one inactive split block of 512 B, plus the tail.
    assert_eq!(a.stats().inactive_split.small_pool.current, 2);
    a.free(x.addr).unwrap();
    a.free(z.addr).unwrap();
    // Everything merged: one free block spanning the segment, no longer split.
    assert_eq!(a.stats().inactive_split.all.current, 0);
    assert_eq!(a.stats().inactive_split_bytes.all.current, 0);
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].blocks.len(), 1);
    assert_eq!(segs[0].blocks[0].size, 2 * MIB);
    a.empty_cache();
    assert_eq!(reserved(&a), 0);
}

#[test]
fn over_capacity_request_succeeds_after_cached_segments_are_released_and_counts_a_retry() {
    // Capacity 40 MiB. Cache a 24 MiB segment, then ask for 30 MiB: 24 + 30 > 40, so the
    // allocator must release the cached 24 MiB segment and retry.
    let mut a = allocator(40 * MIB, AllocatorConfig::default());
    let x = a.malloc(24 * MIB, Category::Activation, None).unwrap();
    a.free(x.addr).unwrap();
    assert_eq!(reserved(&a), 24 * MIB as i64);
    let y = a.malloc(30 * MIB, Category::Activation, None).unwrap();
    assert_eq!(y.size, 30 * MIB);
    assert_eq!(reserved(&a), 30 * MIB as i64);
    let s = a.stats();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(s.num_ooms, 0);
}

#[test]
fn reserved_never_exceeds_capacity_and_oom_reports_pytorch_numbers() {
    let mut a = allocator(30 * MIB, AllocatorConfig::default());
    let _x = a.malloc(16 * MIB, Category::Parameter, Some("w")).unwrap();
    let err = a
        .malloc(16 * MIB, Category::Activation, Some("h"))
        .unwrap_err();
    assert_eq!(err.alloc_size, 16 * MIB);
    assert_eq!(err.capacity, 30 * MIB);
    assert_eq!(err.free, 14 * MIB);
    assert_eq!(err.allocated, 16 * MIB);
    assert_eq!(err.reserved, 16 * MIB);
    let text = err.to_string();
    assert!(text.contains("Tried to allocate 16.00 MiB"), "{text}");
    assert!(
        text.contains("total capacity of 30.00 MiB of which 14.00 MiB is free"),
        "{text}"
    );
    assert!(
        text.contains("16.00 MiB is allocated by tensors, and 0 bytes is reserved but unallocated"),
        "{text}"
    );
    // Nothing is cached, so the advice is about bytes per micro-batch, naming the top category.
    assert!(text.contains("parameter"), "{text}");
    assert_eq!(a.stats().num_ooms, 1);
    assert!(reserved(&a) <= 30 * MIB as i64);
}

#[test]
fn oom_message_points_at_fragmentation_when_cache_is_split() {
    // Two 5 MiB blocks in one 20 MiB segment; free the first: 5 MiB + 10 MiB free but split.
    let mut a = allocator(20 * MIB, AllocatorConfig::default());
    let x = a.malloc(5 * MIB, Category::Activation, None).unwrap();
    let _y = a.malloc(5 * MIB, Category::Activation, None).unwrap();
    a.free(x.addr).unwrap();
    // 12 MiB needs a new segment of 12 MiB: no room, and the split segment cannot be released.
    let err = a.malloc(12 * MIB, Category::Activation, None).unwrap_err();
    assert_eq!(err.reserved_unallocated(), 15 * MIB);
    assert!(err.to_string().contains("expandable segments"), "{err}");
}

#[test]
fn expandable_segments_serve_the_fragmented_request() {
    // The same sequence as above with expandable segments: the large pool's pages are 20 MiB,
    // so the capacity holds one page; freed space merges and unmapped pages are reused.
    let mut a = allocator(40 * MIB, AllocatorConfig::expandable());
    let x = a.malloc(5 * MIB, Category::Activation, None).unwrap();
    let y = a.malloc(5 * MIB, Category::Activation, None).unwrap();
    assert_eq!(y.addr, x.addr + 5 * MIB);
    assert_eq!(reserved(&a), 20 * MIB as i64);
    a.free(x.addr).unwrap();
    // 12 MiB: the hole at x is 5 MiB; the tail after y fits and needs page 2 → 40 MiB reserved.
    let z = a.malloc(12 * MIB, Category::Activation, None).unwrap();
    assert_eq!(z.addr, y.addr + 5 * MIB);
    assert_eq!(reserved(&a), 40 * MIB as i64);
    // Now 20 MiB more cannot be mapped (capacity 40 MiB) and no free range of 20 MiB is mapped,
    // so it fails, while freeing y and z makes the first two pages reusable for it.
    assert!(a.malloc(20 * MIB, Category::Activation, None).is_err());
    a.free(y.addr).unwrap();
    a.free(z.addr).unwrap();
    let w = a.malloc(20 * MIB, Category::Activation, None).unwrap();
    assert_eq!(w.addr, x.addr);
    assert!(reserved(&a) <= 40 * MIB as i64);
}

#[test]
fn expandable_unmaps_free_pages_inside_a_used_range_on_pressure() {
    // Large pages are 20 MiB. Fill pages 0 and 1 with 20 MiB blocks, free the first, then ask
    // for 20 MiB in the small pool's domain of the capacity: page 0 must be unmapped (it is
    // fully free although the range is in use) so that the capacity allows the new mapping.
    let mut a = allocator(40 * MIB, AllocatorConfig::expandable());
    let p0 = a.malloc(20 * MIB, Category::Activation, None).unwrap();
    let _p1 = a.malloc(20 * MIB, Category::Activation, None).unwrap();
    a.free(p0.addr).unwrap();
    assert_eq!(reserved(&a), 40 * MIB as i64);
    // A small request needs a 2 MiB small-pool page: 40 + 2 > 40, so the allocator unmaps the
    // free large page 0 and retries.
    a.malloc(4096, Category::Other, None).unwrap();
    assert_eq!(reserved(&a), 22 * MIB as i64);
    assert_eq!(a.stats().num_alloc_retries, 1);
    assert!(a.stats().num_device_free >= 1);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let config = AllocatorConfig::parse("max_split_size_mb:40").unwrap();
    let mut a = allocator(1 << 40, config);
    let big = a.malloc(64 * MIB, Category::Activation, None).unwrap();
    assert_eq!(a.stats().oversize_allocations.current, 1);
    assert_eq!(a.stats().oversize_segments.current, 1);
    a.free(big.addr).unwrap();
    // A 12 MiB request is below max_split_size: the cached 64 MiB oversize block must not be
    // split for it, so a new 12 MiB segment is reserved.
    a.malloc(12 * MIB, Category::Activation, None).unwrap();
    assert_eq!(a.stats().segment.all.current, 2);
    // A 50 MiB request is oversize and the cached 64 MiB block is within 20 MiB: reused whole.
    let again = a.malloc(50 * MIB, Category::Activation, None).unwrap();
    assert_eq!(again.addr, big.addr);
    assert_eq!(again.size, 64 * MIB);
    assert_eq!(a.stats().max_split_size, 40 * MIB as i64);
}

#[test]
fn garbage_collection_releases_old_cached_segments_above_the_threshold() {
    // Capacity 100 MiB, threshold 0.5: once reserved exceeds 50 MiB, a new segment first
    // reclaims cached unsplit large blocks (here two 24 MiB segments) before reserving.
    let config = AllocatorConfig::parse("garbage_collection_threshold:0.5").unwrap();
    let mut a = allocator(100 * MIB, config);
    let x = a.malloc(24 * MIB, Category::Activation, None).unwrap();
    let y = a.malloc(26 * MIB, Category::Activation, None).unwrap();
    let z = a.malloc(28 * MIB, Category::Activation, None).unwrap();
    a.free(x.addr).unwrap();
    a.free(y.addr).unwrap();
    assert_eq!(reserved(&a), 78 * MIB as i64);
    // 30 MiB fits nothing cached; reserved 78 > 50 → GC frees cached blocks until ≥ 28 MiB
    // are reclaimed: both (same age) go, leaving z's 28 MiB, then 30 MiB is reserved.
    a.malloc(30 * MIB, Category::Activation, None).unwrap();
    assert_eq!(reserved(&a), 58 * MIB as i64);
    assert_eq!(a.stats().num_alloc_retries, 0);
    let _ = z;
}

#[test]
fn categories_and_peak_breakdown_follow_allocations() {
    let mut a = allocator(1 << 40, AllocatorConfig::default());
    let w = a.malloc(12 * MIB, Category::Parameter, Some("w")).unwrap();
    let h = a.malloc(4 * MIB, Category::Activation, Some("h")).unwrap();
    a.free(h.addr).unwrap();
    let g = a.malloc(2 * MIB, Category::Gradient, Some("g")).unwrap();
    let s = a.stats();
    // Peak allocated was 12 + 4 MiB, with the activation still live.
    assert_eq!(s.allocated_bytes.all.peak, 16 * MIB as i64);
    assert_eq!(s.category_bytes_at_peak[Category::Activation], 4 * MIB);
    assert_eq!(s.category_bytes_at_peak[Category::Gradient], 0);
    assert_eq!(
        s.category_bytes[Category::Gradient.index()].peak,
        2 * MIB as i64
    );
    assert_eq!(
        a.category_bytes().total(),
        s.allocated_bytes.all.current as u64
    );
    let _ = (w, g);
}

#[test]
fn double_free_is_an_error_not_a_corruption() {
    let mut a = allocator(1 << 40, AllocatorConfig::default());
    let x = a.malloc(100, Category::Other, None).unwrap();
    a.free(x.addr).unwrap();
    assert!(a.free(x.addr).is_err());
    assert!(a.free(12345).is_err());
}

#[test]
fn requests_of_an_exabyte_are_refused_outright() {
    let mut a = allocator(1 << 40, AllocatorConfig::default());
    let err = a.malloc(1 << 61, Category::Other, None).unwrap_err();
    assert!(err.to_string().contains("more than 1EB"));
}

#[test]
fn reset_peak_sets_peaks_to_current() {
    let mut a = allocator(1 << 40, AllocatorConfig::default());
    let x = a.malloc(30 * MIB, Category::Activation, None).unwrap();
    a.free(x.addr).unwrap();
    assert_eq!(a.stats().allocated_bytes.all.peak, 30 * MIB as i64);
    a.reset_peak_stats();
    assert_eq!(a.stats().allocated_bytes.all.peak, 0);
    assert_eq!(a.stats().reserved_bytes.all.peak, 30 * MIB as i64);
}

/// Addresses that fall with each new segment, as `mmap` usually places them on Linux.
#[derive(Debug)]
struct FallingSource {
    next: u64,
}

impl headroom_memory::SegmentSource for FallingSource {
    fn name(&self) -> &'static str {
        "falling"
    }
    fn is_backed(&self) -> bool {
        false
    }
    fn allocate(&mut self, size: u64) -> Result<u64, headroom_memory::source::SourceError> {
        self.next -= size.div_ceil(2 * MIB) * 2 * MIB;
        Ok(self.next)
    }
    fn free(&mut self, _: u64, _: u64) {}
    fn reserve(&mut self, size: u64) -> Result<u64, headroom_memory::source::SourceError> {
        self.allocate(size)
    }
    fn map(&mut self, _: u64, _: u64) -> Result<(), headroom_memory::source::SourceError> {
        Ok(())
    }
    fn unmap(&mut self, _: u64, _: u64) {}
    fn release(&mut self, _: u64, _: u64) {}
}

#[test]
fn equal_free_blocks_go_to_the_oldest_segment_whatever_the_addresses() {
    // x (8 MiB) and y (12 MiB, the exact remainder) fill the first 20 MiB segment S0; c (8)
    // and z (4) take the front of a second one, S1, leaving 8 MiB free at its back. Freeing x
    // makes two free 8 MiB blocks: S0's front and S1's back. The oldest segment wins the tie,
    // so d takes S0's front again; freeing y then leaves S0 split (d allocated), and
    // empty_cache releases nothing: 40 MiB stay reserved. Had d gone to S1 (the lower address
    // when segments fall), freeing y would have emptied S0 and empty_cache would release it
    // (20 MiB). A dry run's rising addresses and the host's falling ones must take the same
    // branch, or their later peaks part.
    let sources: [Box<dyn headroom_memory::SegmentSource>; 2] = [
        Box::new(VirtualSource::default()),
        Box::new(FallingSource { next: 1 << 46 }),
    ];
    for source in sources {
        let mut a = CachingAllocator::new(1 << 40, AllocatorConfig::default(), source);
        let x = a.malloc(8 * MIB, Category::Activation, None).unwrap();
        let y = a.malloc(12 * MIB, Category::Activation, None).unwrap();
        let _c = a.malloc(8 * MIB, Category::Activation, None).unwrap();
        let _z = a.malloc(4 * MIB, Category::Activation, None).unwrap();
        assert_eq!(reserved(&a), 40 * MIB as i64);
        a.free(x.addr).unwrap();
        let d = a.malloc(8 * MIB, Category::Activation, None).unwrap();
        assert_eq!(d.addr, x.addr, "the oldest segment's block");
        a.free(y.addr).unwrap();
        a.empty_cache();
        assert_eq!(reserved(&a), 40 * MIB as i64);
    }
}
