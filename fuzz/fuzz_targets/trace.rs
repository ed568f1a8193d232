//! Allocation traces (JSON) and PyTorch snapshots (pickles): read and replayed, or refused.
#![no_main]

use headroom_memory::replay::{parse_trace, replay};
use headroom_memory::{AllocatorConfig, CachingAllocator, VirtualSource};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(trace) = parse_trace(bytes) {
        let source = Box::new(VirtualSource::default());
        let mut allocator = CachingAllocator::new(1 << 40, AllocatorConfig::default(), source);
        let _ = replay(&trace, &mut allocator);
    }
});
