//! A memory-mapped token file is never loaded: drawing batches from it grows the process's
//! anonymous memory by no more than the loader's stated buffers and orders, and its resident
//! file pages by no more than the loader's stated bound (far below the file). Measured from
//! `/proc/self/status` in a test binary of its own, so no other test shares the process.
//! The 1 GB case is `#[ignore]`d (run it with `cargo test --release -p headroom-train --test
//! loader_memory -- --ignored`; docs/benchmarks.md records it).

use headroom_memory::host::process_memory;
use headroom_memory::synthetic::SplitMix64;
use headroom_train::data::token_file::{TokenFileWriter, Verify};
use headroom_train::data::{
    DistributedSampler, Loader, LoaderConfig, SamplerKind, TokenFile, TokenSampler, Tokens,
};

/// Allocator and thread bookkeeping outside the loader's own buffers (malloc arenas of the
/// worker threads, the test harness).
const SLACK: u64 = 8 << 20;

fn measure(tokens: u64, rows: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    let mut w = TokenFileWriter::create(&path, 256).unwrap();
    let mut rng = SplitMix64::new(1);
    let chunk: Vec<u32> = (0..1 << 20).map(|_| rng.range(0, 256) as u32).collect();
    for _ in 0..tokens >> 20 {
        w.push(&chunk).unwrap();
    }
    let header = w.finish().unwrap();
    let before = process_memory().expect("Linux /proc");
    let file = TokenFile::open(&path, Verify::Contents).unwrap();
    let sampler =
        TokenSampler::over(Tokens::Mapped(file), 256, 0.1, 7, SamplerKind::Shuffled).unwrap();
    let mut loader = Loader::new(
        sampler,
        LoaderConfig {
            workers: 2,
            prefetch: 4,
            host_memory: None,
            pin_memory: true,
            micro_batch: rows,
            shard: DistributedSampler::single(),
        },
    )
    .unwrap();
    let mut sum = 0i64;
    for _ in 0..400 {
        let b = loader.next_batch(rows).unwrap();
        sum += b.inputs()[0] + b.targets()[0];
    }
    let after = process_memory().unwrap();
    let r = loader.report();
    let anon = after.rss_anon_bytes.saturating_sub(before.rss_anon_bytes);
    let file = after.rss_file_bytes.saturating_sub(before.rss_file_bytes);
    eprintln!(
        "{} byte file: anonymous +{anon} (stated {} + orders {}), mapped file pages +{file} (bound {}), peak RSS {}; checksum of draws {sum}",
        header.file_bytes(),
        r.buffer_bytes,
        r.index_bytes,
        r.mapped_resident_bound,
        after.peak_rss_bytes
    );
    assert!(
        anon <= r.buffer_bytes + r.index_bytes + SLACK,
        "anonymous +{anon}"
    );
    assert!(file <= r.mapped_resident_bound, "file pages +{file}");
    assert!(r.mapped_resident_bound < header.file_bytes() / 4);
    assert_eq!(r.resident_token_bytes, 0);
}

#[test]
fn a_mapped_token_file_is_never_loaded() {
    // 32 Mi tokens: a 64 MiB file; batches of 4 keep the stated bound under a quarter of it.
    measure(32 << 20, 4);
}

#[test]
#[ignore = "writes and reads a 1 GB file; run with --ignored (docs/benchmarks.md)"]
fn a_one_gigabyte_token_file_is_never_loaded() {
    measure(512 << 20, 16);
}
