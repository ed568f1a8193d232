//! Peak reserved / peak allocated of the caching allocator and of expandable segments on the
//! same traces, printed as a Markdown table. Run:
//! `cargo run --release -p headroom-memory --example fragmentation`.

use headroom_memory::replay::{Trace, replay};
use headroom_memory::size::{GIB, format_bytes};
use headroom_memory::synthetic::{fragmenting, training_like};
use headroom_memory::{AllocatorConfig, CachingAllocator, VirtualSource};

fn run(trace: &Trace, config: AllocatorConfig, capacity: u64) -> (u64, u64, usize, u64) {
    let mut a = CachingAllocator::new(capacity, config, Box::new(VirtualSource::default()));
    let outcome = replay(trace, &mut a);
    let s = a.stats();
    (
        s.allocated_bytes.all.peak as u64,
        s.reserved_bytes.all.peak as u64,
        outcome.ooms.len(),
        s.num_alloc_retries,
    )
}

fn main() {
    let traces = [
        (
            "training_like (12 layers, 4 steps)",
            training_like(12, 4, 256, 7),
        ),
        (
            "training_like (24 layers, 8 steps, width 512)",
            training_like(24, 8, 512, 3),
        ),
        ("fragmenting (4000 allocations)", fragmenting(4000, 11)),
        ("fragmenting (20000 allocations)", fragmenting(20000, 5)),
    ];
    println!(
        "| trace | capacity | allocator | peak allocated | peak reserved | reserved / allocated | OOMs | retries |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, trace) in &traces {
        // Unlimited first, then a capacity 10 % above the unlimited caching peak's allocated
        // bytes, where fragmentation decides whether the run fits.
        let (peak_alloc, _, _, _) = run(trace, AllocatorConfig::default(), 1 << 40);
        for capacity in [1u64 << 40, peak_alloc + peak_alloc / 10] {
            for (label, config) in [
                ("caching", AllocatorConfig::default()),
                ("expandable", AllocatorConfig::expandable()),
            ] {
                let (alloc, reserved, ooms, retries) = run(trace, config, capacity);
                let cap = if capacity == 1 << 40 {
                    "unlimited".to_string()
                } else {
                    format_bytes(capacity)
                };
                println!(
                    "| {name} | {cap} | {label} | {} | {} | {:.3} | {ooms} | {retries} |",
                    format_bytes(alloc),
                    format_bytes(reserved),
                    reserved as f64 / alloc as f64
                );
            }
        }
    }
    let _ = GIB;
}
