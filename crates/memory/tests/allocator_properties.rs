//! Invariants of the caching allocator under random allocation sequences, in both the
//! fixed-segment and the expandable mode: reserved ≤ capacity, allocated ≤ reserved, no two
//! live blocks overlap, the statistics agree with the block layout, every allocated byte is in
//! exactly one category, and freeing everything then emptying the cache leaves nothing reserved.

use headroom_memory::allocator::BlockState;
use headroom_memory::size::MIB;
use headroom_memory::{AllocatorConfig, CachingAllocator, Category, VirtualSource};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: u64, category: usize },
    Free { pick: usize },
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        1u64..4096,
        4096u64..(2 * MIB),
        (2 * MIB)..(12 * MIB),
        (12 * MIB)..(48 * MIB)
    ];
    prop_oneof![
        6 => (size, 0usize..Category::COUNT).prop_map(|(size, category)| Op::Alloc { size, category }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => Just(Op::EmptyCache),
    ]
}

fn check_invariants(a: &CachingAllocator, capacity: u64) {
    let s = a.stats();
    let reserved = s.reserved_bytes.all.current as u64;
    let allocated = s.allocated_bytes.all.current as u64;
    assert!(
        reserved <= capacity,
        "reserved {reserved} > capacity {capacity}"
    );
    assert!(allocated <= reserved);
    assert!(s.requested_bytes.all.current as u64 <= allocated);
    assert_eq!(
        a.category_bytes().total(),
        allocated,
        "every byte in exactly one category"
    );

    let segments = a.segments();
    let seg_total: u64 = segments.iter().map(|seg| seg.total_size).sum();
    assert_eq!(
        seg_total, reserved,
        "segments cover exactly the reserved bytes"
    );
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut inactive_split = 0u64;
    for seg in &segments {
        let covered: u64 = seg.blocks.iter().map(|b| b.size).sum();
        assert_eq!(covered, seg.total_size, "blocks tile their segment");
        for b in &seg.blocks {
            assert!(b.address >= seg.address && b.address + b.size <= seg.address + seg.total_size);
            match b.state {
                BlockState::ActiveAllocated => live.push((b.address, b.size)),
                BlockState::Inactive if !seg.is_expandable && seg.blocks.len() > 1 => {
                    inactive_split += b.size
                }
                BlockState::Inactive => {}
            }
        }
    }
    live.sort();
    for w in live.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "live blocks overlap");
    }
    assert_eq!(live.iter().map(|l| l.1).sum::<u64>(), allocated);
    assert_eq!(s.inactive_split_bytes.all.current as u64, inactive_split);
    assert_eq!(s.segment.all.current as usize, segments.len());
}

fn run(ops: Vec<Op>, capacity: u64, config: AllocatorConfig) {
    let mut a = CachingAllocator::new(capacity, config, Box::new(VirtualSource::default()));
    let mut live = Vec::new();
    for op in ops {
        match op {
            Op::Alloc { size, category } => {
                if let Ok(x) = a.malloc(size, Category::ALL[category], None) {
                    live.push(x.addr);
                }
            }
            Op::Free { pick } => {
                if !live.is_empty() {
                    let addr = live.swap_remove(pick % live.len());
                    a.free(addr).unwrap();
                }
            }
            Op::EmptyCache => a.empty_cache(),
        }
        check_invariants(&a, capacity);
    }
    for addr in live {
        a.free(addr).unwrap();
    }
    a.empty_cache();
    check_invariants(&a, capacity);
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
    assert_eq!(a.stats().allocated_bytes.all.current, 0);
    assert_eq!(a.stats().active_bytes.all.current, 0);
    assert_eq!(a.stats().inactive_split_bytes.all.current, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn fixed_segments_keep_invariants(ops in prop::collection::vec(op(), 1..120)) {
        run(ops, 160 * MIB, AllocatorConfig::default());
    }

    #[test]
    fn expandable_segments_keep_invariants(ops in prop::collection::vec(op(), 1..120)) {
        run(ops, 160 * MIB, AllocatorConfig::expandable());
    }

    #[test]
    fn oversize_and_gc_settings_keep_invariants(ops in prop::collection::vec(op(), 1..120)) {
        let config = AllocatorConfig::parse("max_split_size_mb:24,garbage_collection_threshold:0.7").unwrap();
        run(ops, 160 * MIB, config);
    }
}
