//! Fuzzing in `cargo test`: mutated and truncated allocation traces (JSON) and PyTorch
//! snapshots (pickles) are read without a panic, an abort or an unbounded allocation — each is
//! either replayed or refused with an error. Seeds are valid files; proptest flips, inserts and
//! cuts bytes (a few hundred cases, seconds; the cargo-fuzz targets run the same property for
//! as long as one likes).

use headroom_memory::replay::{parse_trace, replay};
use headroom_memory::{AllocatorConfig, CachingAllocator, VirtualSource};
use proptest::prelude::*;

const JSON_SEED: &str = r#"[{"action": "alloc", "addr": 1, "size": 1024},
 {"action": "alloc", "addr": 2, "size": 3000000}, {"action": "free", "addr": 1, "size": 1024},
 {"action": "free", "addr": 2, "size": 3000000}]"#;

/// A snapshot as `headroom memory replay --snapshot` writes it (serde-pickle protocol 3).
fn pickle_seed() -> Vec<u8> {
    use serde_pickle::{HashableValue as H, Value as V};
    let event = |action: &str, addr: i64, size: i64| {
        V::Dict(
            [
                (H::String("action".into()), V::String(action.into())),
                (H::String("addr".into()), V::I64(addr)),
                (H::String("size".into()), V::I64(size)),
                (H::String("frames".into()), V::List(vec![])),
            ]
            .into_iter()
            .collect(),
        )
    };
    let traces = V::List(vec![V::List(vec![
        event("alloc", 16, 512),
        event("free_completed", 16, 512),
    ])]);
    let snapshot = V::Dict(
        [
            (H::String("segments".into()), V::List(vec![])),
            (H::String("device_traces".into()), traces),
        ]
        .into_iter()
        .collect(),
    );
    serde_pickle::value_to_vec(&snapshot, serde_pickle::SerOptions::new()).unwrap()
}

/// Applies `edits` (position, byte; position past the end appends) and cuts at `cut`.
fn mutate(seed: &[u8], edits: &[(usize, u8, bool)], cut: usize) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for &(at, byte, insert) in edits {
        let at = at % (bytes.len() + 1);
        if insert || at == bytes.len() {
            bytes.insert(at, byte);
        } else {
            bytes[at] = byte;
        }
    }
    bytes.truncate(cut % (bytes.len() + 1) + bytes.len() / 2);
    bytes
}

fn read_and_replay(bytes: &[u8]) {
    if let Ok(trace) = parse_trace(bytes) {
        let source = Box::new(VirtualSource::default());
        let mut allocator = CachingAllocator::new(1 << 30, AllocatorConfig::default(), source);
        let _ = replay(&trace, &mut allocator);
    }
}

/// Cases per property: `HEADROOM_FUZZ_CASES` for a long run, else a few seconds' worth.
fn cases(default: u32) -> u32 {
    std::env::var("HEADROOM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(300)))]

    #[test]
    fn mutated_json_traces_never_panic(
        edits in prop::collection::vec((0usize..400, any::<u8>(), any::<bool>()), 0..8),
        cut in 0usize..400,
    ) {
        read_and_replay(&mutate(JSON_SEED.as_bytes(), &edits, cut));
    }

    #[test]
    fn mutated_snapshots_never_panic(
        edits in prop::collection::vec((0usize..400, any::<u8>(), any::<bool>()), 0..8),
        cut in 0usize..400,
    ) {
        read_and_replay(&mutate(&pickle_seed(), &edits, cut));
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        read_and_replay(&bytes);
    }
}

#[test]
fn the_seeds_are_valid() {
    assert!(parse_trace(JSON_SEED.as_bytes()).is_ok());
    assert!(parse_trace(&pickle_seed()).is_ok());
}
