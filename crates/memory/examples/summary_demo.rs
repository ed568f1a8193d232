//! Prints the memory summary of a small allocation sequence (used to eyeball the layout).
use headroom_memory::size::MIB;
use headroom_memory::{AllocatorConfig, CachingAllocator, Category, VirtualSource, memory_summary};

fn main() {
    let mut a = CachingAllocator::new(
        1 << 34,
        AllocatorConfig::default(),
        Box::new(VirtualSource::default()),
    );
    let w = a.malloc(120 * MIB, Category::Parameter, Some("w")).unwrap();
    let h: Vec<_> = (0..40)
        .map(|i| {
            a.malloc((i + 1) * 300_000, Category::Activation, None)
                .unwrap()
        })
        .collect();
    for x in h.iter().step_by(2) {
        a.free(x.addr).unwrap();
    }
    let _ = w;
    print!("{}", memory_summary(&a));
}
