//! Alloc+free throughput of the caching allocator against the system allocator, on the same
//! replayed training-like trace (and on the trace built to fragment). Run:
//! `cargo bench -p headroom-memory --bench allocator`.

use divan::Bencher;
use headroom_memory::replay::{ReplayEvent, Trace, replay};
use headroom_memory::synthetic::{fragmenting, training_like};
use headroom_memory::{AllocatorConfig, CachingAllocator, HostSource, VirtualSource};
use std::alloc::{Layout, alloc, dealloc};
use std::collections::HashMap;

fn main() {
    divan::main();
}

fn traces() -> [(&'static str, Trace); 2] {
    [
        ("training_like", training_like(12, 4, 256, 7)),
        ("fragmenting", fragmenting(4000, 11)),
    ]
}

fn trace(name: &str) -> Trace {
    traces()
        .into_iter()
        .find(|(n, _)| *n == name)
        .expect("known trace")
        .1
}

const TRACES: [&str; 2] = ["training_like", "fragmenting"];

/// The system allocator (glibc malloc behind `std::alloc`) serving the same events, 512-byte
/// aligned like the caching allocator's blocks.
fn system_replay(trace: &Trace) {
    let mut live: HashMap<u64, (*mut u8, Layout)> = HashMap::with_capacity(1024);
    for e in &trace.events {
        match *e {
            ReplayEvent::Alloc { id, size, .. } => {
                let layout = Layout::from_size_align(size as usize, 512).unwrap();
                // SAFETY: the layout has non-zero size; the pointer is freed below with it.
                let p = unsafe { alloc(layout) };
                assert!(!p.is_null());
                // Touch the first byte so that lazily mapped memory is really provided.
                // SAFETY: p points at `size` ≥ 1 writable bytes.
                unsafe { p.write(1) };
                live.insert(id, (p, layout));
            }
            ReplayEvent::Free { id, .. } => {
                let (p, layout) = live.remove(&id).unwrap();
                // SAFETY: p was allocated above with this layout and is freed once.
                unsafe { dealloc(p, layout) };
            }
        }
    }
}

#[divan::bench(args = TRACES)]
fn system_allocator(bencher: Bencher, name: &str) {
    let t = trace(name);
    bencher
        .counter(divan::counter::ItemsCount::new(t.events.len()))
        .bench_local(|| system_replay(&t));
}

/// Caching allocator on host memory, warm: the cache is filled by one replay beforehand, as in
/// every training step after the first.
#[divan::bench(args = TRACES)]
fn caching_allocator_host(bencher: Bencher, name: &str) {
    let t = trace(name);
    let mut a = CachingAllocator::new(1 << 40, AllocatorConfig::default(), Box::new(HostSource));
    replay(&t, &mut a);
    bencher
        .counter(divan::counter::ItemsCount::new(t.events.len()))
        .bench_local(|| replay(&t, &mut a));
}

#[divan::bench(args = TRACES)]
fn expandable_allocator_host(bencher: Bencher, name: &str) {
    let t = trace(name);
    let mut a = CachingAllocator::new(
        64 << 30,
        AllocatorConfig::expandable(),
        Box::new(HostSource),
    );
    replay(&t, &mut a);
    bencher
        .counter(divan::counter::ItemsCount::new(t.events.len()))
        .bench_local(|| replay(&t, &mut a));
}

/// Bookkeeping only (no memory behind addresses): the allocator's own cost per event.
#[divan::bench(args = TRACES)]
fn caching_allocator_virtual(bencher: Bencher, name: &str) {
    let t = trace(name);
    let mut a = CachingAllocator::new(
        1 << 40,
        AllocatorConfig::default(),
        Box::new(VirtualSource::default()),
    );
    replay(&t, &mut a);
    bencher
        .counter(divan::counter::ItemsCount::new(t.events.len()))
        .bench_local(|| replay(&t, &mut a));
}
