//! The data loader against the sampler alone: the same batches for any number of workers and
//! any queue depth (through skips, seeks and a change of batch size), a queue that never
//! exceeds its depth, a host budget the pool's accounting respects, failures that end with the
//! file and offset named instead of hanging, and training runs bitwise the same with workers and
//! from a prepared token file.

use headroom_train::Trainer;
use headroom_train::config::TrainConfig;
use headroom_train::data::LoaderReport;
use headroom_train::data::prepare::{PrepareLimits, prepare};
use headroom_train::data::token_file::{HEADER_BYTES, Header, TokenFileWriter, Verify};
use headroom_train::data::tokenizer::Tokenizer;
use headroom_train::data::{
    Corpus, DataError, DataPosition, DistributedSampler, Loader, LoaderConfig, SamplerKind,
    TokenBatch, TokenFile, TokenSampler, Tokens,
};
use std::borrow::Cow;
use std::path::Path;

fn corpus(n: usize) -> Corpus {
    Corpus {
        name: "test".into(),
        bytes: Cow::Owned((0..n).map(|i| (i * 7 % 251) as u8).collect()),
    }
}

fn sampler() -> TokenSampler {
    TokenSampler::new(&corpus(6000), 16, 0.1, 5).unwrap()
}

fn config(workers: usize, prefetch: usize) -> LoaderConfig {
    LoaderConfig {
        workers,
        prefetch,
        host_memory: None,
        pin_memory: false,
        micro_batch: 4,
        shard: DistributedSampler::single(),
    }
}

/// One request of a scripted consumer.
#[derive(Clone, Copy)]
enum Ask {
    Next(usize),
    Skip(usize),
    Seek(DataPosition),
}

/// What the sampler alone gives for `script`.
fn reference(script: &[Ask]) -> Vec<TokenBatch> {
    let mut s = sampler();
    let mut out = Vec::new();
    for ask in script {
        match *ask {
            Ask::Next(b) => out.push(s.next_train(b)),
            Ask::Skip(b) => s.skip_train(b),
            Ask::Seek(p) => s.seek(p),
        }
    }
    out
}

fn through_loader(script: &[Ask], config: LoaderConfig) -> (Vec<TokenBatch>, Loader) {
    let mut l = Loader::new(sampler(), config).unwrap();
    let mut out = Vec::new();
    for ask in script {
        match *ask {
            Ask::Next(b) => out.push(l.next_train(b).unwrap()),
            Ask::Skip(b) => l.skip_train(b),
            Ask::Seek(p) => l.seek(p),
        }
    }
    (out, l)
}

/// 60 batches of 4, then a rank's pattern (skip, two batches, skip), a seek back, and an
/// out-of-memory retry's half batches; 5400 training tokens / 16 = 337 windows per epoch, so
/// the script crosses an epoch.
fn script() -> Vec<Ask> {
    let mut s: Vec<Ask> = (0..60).map(|_| Ask::Next(4)).collect();
    for _ in 0..10 {
        s.extend([Ask::Skip(8), Ask::Next(4), Ask::Next(4), Ask::Skip(8)]);
    }
    s.push(Ask::Seek(DataPosition {
        epoch: 0,
        cursor: 17,
    }));
    s.extend((0..40).map(|_| Ask::Next(2)));
    s.extend((0..30).map(|_| Ask::Next(6)));
    s
}

#[test]
fn batches_are_identical_for_any_workers_and_queue_depth() {
    let script = script();
    let expected = reference(&script);
    for workers in [0, 1, 4] {
        for prefetch in [1, 2, 7] {
            let (got, loader) = through_loader(&script, config(workers, prefetch));
            assert!(got == expected, "workers {workers}, prefetch {prefetch}");
            let r = loader.report();
            assert!(
                r.peak_queue <= prefetch,
                "queue {} > {prefetch}",
                r.peak_queue
            );
            assert_eq!(r.batches, expected.len() as u64);
        }
    }
}

#[test]
fn a_rank_loader_prefetches_its_shard_and_hits() {
    // Rank 1 of 3, micro-batch 2 × accumulation 3: it skips 6, takes 3 × 2, skips 6.
    let shard = DistributedSampler {
        rank: 1,
        world: 3,
        chunk: 6,
    };
    let mut script = Vec::new();
    for _ in 0..30 {
        script.extend([Ask::Skip(6), Ask::Next(2), Ask::Next(2), Ask::Next(2)]);
        script.push(Ask::Skip(6));
    }
    let expected = reference(&script);
    let (got, loader) = through_loader(
        &script,
        LoaderConfig {
            micro_batch: 2,
            shard,
            ..config(2, 3)
        },
    );
    assert!(got == expected);
    // Every request was the one predicted: the queue was never dropped.
    assert_eq!(loader.report().restarts, 0);
    assert_eq!(
        loader.report().peak_queue,
        3,
        "the queue fills to its depth"
    );
}

#[test]
fn the_host_budget_shortens_the_queue_and_is_never_exceeded() {
    // A batch of 4 × 16 ids, inputs and targets in i64: 1,024 bytes of staging.
    let batch = 2 * 8 * 4 * 16;
    let worker = 256 * 1024 + 4 * 17;
    // Room for 2 workers and 3 buffers (a queue of 2), not for the 8 the queue of 7 wants.
    let budget = 2 * worker + 3 * batch + 100;
    let script: Vec<Ask> = (0..50).map(|_| Ask::Next(4)).collect();
    let (got, mut loader) = through_loader(
        &script,
        LoaderConfig {
            host_memory: Some(budget),
            ..config(2, 7)
        },
    );
    assert!(got == reference(&script));
    let r = loader.report();
    assert_eq!(r.effective_prefetch, 2);
    assert!(
        r.staging.peak_bytes <= budget - 2 * worker,
        "{:?}",
        r.staging
    );
    assert!(r.buffer_bytes <= budget);
    assert!(r.peak_queue <= 2);
    let warnings = loader.take_warnings();
    assert!(warnings[0].contains("--prefetch 7"), "{warnings:?}");
    // Too little for even one queued batch: a clear error before any work.
    let e = Loader::new(
        sampler(),
        LoaderConfig {
            host_memory: Some(batch),
            ..config(2, 7)
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("--host-memory"), "{e}");
}

fn write_tokens(path: &Path, vocab: u64, tokens: &[u32]) -> Header {
    let mut w = TokenFileWriter::create(path, vocab).unwrap();
    w.push(tokens).unwrap();
    w.finish().unwrap()
}

#[test]
fn a_prepared_file_gives_the_batches_of_its_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.bin");
    let text = corpus(6000);
    let ids: Vec<u32> = text.bytes.iter().map(|&b| b as u32).collect();
    let h = write_tokens(&path, 256, &ids);
    // Byte-level tokens fit u16: 64 bytes of header + 2 per token.
    assert_eq!(h.token_bytes, 2);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 + 2 * 6000);
    let file = TokenFile::open(&path, Verify::Contents).unwrap();
    let mapped =
        TokenSampler::over(Tokens::Mapped(file), 16, 0.1, 5, SamplerKind::Shuffled).unwrap();
    let mut l = Loader::new(mapped, config(3, 2)).unwrap();
    let mut s = sampler();
    for _ in 0..100 {
        assert_eq!(l.next_train(4).unwrap(), s.next_train(4));
    }
    assert_eq!(
        l.sampler().try_validation_batches(4, 8).unwrap(),
        s.validation_batches(4, 8)
    );
    let r = l.report();
    assert_eq!((r.resident_token_bytes, r.mapped_bytes), (0, 64 + 2 * 6000));
}

#[test]
fn damaged_token_files_are_named_with_what_is_wrong_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.bin");
    let ids: Vec<u32> = (0..1000).map(|i| i % 256).collect();
    write_tokens(&path, 256, &ids);
    let good = std::fs::read(&path).unwrap();
    let open = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        TokenFile::open(&path, Verify::Contents)
            .unwrap_err()
            .to_string()
    };
    let name = path.display().to_string();
    let fix = "headroom data prepare";
    // Truncated: 1,000 tokens promised, 10 bytes missing.
    let e = open(&good[..good.len() - 10]);
    assert!(
        e.contains(&name) && e.contains("truncated") && e.contains("2064") && e.contains(fix),
        "{e}"
    );
    // Cut inside the header.
    let e = open(&good[..20]);
    assert!(e.contains("truncated") && e.contains(fix), "{e}");
    // One token byte flipped: the checksum.
    let mut flipped = good.clone();
    flipped[HEADER_BYTES + 501] ^= 0x01;
    let e = open(&flipped);
    assert!(
        e.contains(&name) && e.contains("checksum") && e.contains(fix),
        "{e}"
    );
    // A header byte flipped (the vocabulary size).
    let mut header = good.clone();
    header[17] ^= 0x40;
    let e = open(&header);
    assert!(e.contains("header's checksum") && e.contains(fix), "{e}");
    // Not a token file at all.
    let e = open(b"Of Mans First Disobedience");
    assert!(e.contains("not a headroom token file"), "{e}");
}

#[test]
fn a_worker_that_fails_names_the_file_and_offset_and_nothing_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.bin");
    // A file whose checksum is right but whose token 3000 lies outside its vocabulary of 200:
    // written with a vocabulary of 256, then given a header that says 200.
    let ids: Vec<u32> = (0..6000)
        .map(|i| if i == 3000 { 250 } else { i % 200 })
        .collect();
    let h = write_tokens(&path, 256, &ids);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..HEADER_BYTES].copy_from_slice(
        &Header {
            vocab_size: 200,
            ..h
        }
        .encode(),
    );
    std::fs::write(&path, &bytes).unwrap();
    // Checked whole, it is refused at once, with the offset: 64 + 2 × 3000.
    let e = TokenFile::open(&path, Verify::Contents)
        .unwrap_err()
        .to_string();
    assert!(e.contains("offset 6064") && e.contains("250"), "{e}");
    // Opened by shape only, the worker that reaches the token fails the run.
    for workers in [0, 1, 4] {
        let file = TokenFile::open(&path, Verify::Shape).unwrap();
        let s =
            TokenSampler::over(Tokens::Mapped(file), 16, 0.1, 5, SamplerKind::Sequential).unwrap();
        let mut l = Loader::new(s, config(workers, 3)).unwrap();
        // Window k covers tokens 16k..=16k + 16: token 3000 is in window 187 only (tokens
        // 2992..=3008), the 47th batch of 4 in file order.
        let failed = (0..100).find_map(|i| l.next_train(4).err().map(|e| (i, e)));
        let (at, e) = failed.expect("the bad token is reached");
        assert_eq!(at, 46, "workers {workers}");
        if workers > 0 {
            assert!(matches!(e, DataError::Worker { .. }), "{e}");
        }
        let e = e.to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("offset 6064"),
            "{e}"
        );
    }
}

#[test]
fn staging_buffers_are_page_locked_or_say_why() {
    let (_, loader) = through_loader(
        &[Ask::Next(4), Ask::Next(4)],
        LoaderConfig {
            pin_memory: true,
            ..config(1, 2)
        },
    );
    let s = loader.report().staging;
    assert!(s.peak_buffers >= 1);
    assert!(s.pinned || s.pin_error.is_some_and(|w| w.contains("RLIMIT_MEMLOCK")));
}

fn tiny_run(workers: usize, prefetch: usize, data: Option<&Path>) -> (Vec<u64>, LoaderReport) {
    let config = TrainConfig {
        model: Some("gpt-tiny".into()),
        micro_batch: Some(4),
        accumulation: Some(2),
        steps: Some(6),
        eval_every: Some(0),
        eval_batches: Some(1),
        warmup_steps: Some(1),
        device_memory: Some("256MiB".parse().unwrap()),
        seed: Some(3),
        workers: Some(workers),
        prefetch: Some(prefetch),
        data: data.map(Path::to_path_buf),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    let corpus = match data {
        Some(path) => Corpus::prepared(path),
        None => Corpus::bundled(),
    };
    let mut t = Trainer::new(config, &corpus).unwrap();
    let report = t.train(&mut |_| {}).unwrap();
    let bits = report.losses.iter().map(|l| l.to_bits()).collect();
    (bits, report.loader.clone().unwrap())
}

#[test]
fn training_is_bitwise_the_same_for_any_workers_and_from_a_prepared_file() {
    let (expected, synchronous) = tiny_run(0, 2, None);
    assert_eq!(synchronous.batches, 6 * 2);
    assert_eq!(
        synchronous.staging.peak_buffers, 1,
        "one buffer without workers"
    );
    for (workers, prefetch) in [(1, 1), (4, 3)] {
        let (losses, loader) = tiny_run(workers, prefetch, None);
        assert_eq!(losses, expected, "workers {workers}, prefetch {prefetch}");
        assert!(loader.peak_queue <= prefetch);
        assert_eq!(
            loader.restarts, 0,
            "a single rank's requests are all predicted"
        );
    }
    // The bundled corpus prepared byte-level is the same token stream.
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("poem.txt");
    std::fs::write(&text, Corpus::bundled().bytes.as_ref()).unwrap();
    let tokens = dir.path().join("poem.bin");
    let prepared = prepare(&text, &tokens, &Tokenizer::Bytes, &PrepareLimits::default()).unwrap();
    assert_eq!(prepared.tokens, 454_481);
    let (losses, loader) = tiny_run(2, 2, Some(&tokens));
    assert_eq!(losses, expected);
    assert_eq!(loader.source, "token file");
    assert_eq!(loader.mapped_bytes, 64 + 2 * 454_481);
}

/// Losses of every rank of a 3-rank DDP run (micro-batch 2 × accumulation 2), and each rank's
/// loader report.
fn ddp_run(workers: usize) -> Vec<(Vec<u64>, LoaderReport)> {
    use headroom_comm::ThreadGroup;
    use headroom_memory::{AllocatorConfig, Device};
    let corpus = Corpus::bundled();
    let results = ThreadGroup::run(3, std::time::Duration::from_secs(60), |comm| {
        let c = TrainConfig {
            model: Some("gpt-tiny".into()),
            micro_batch: Some(2),
            accumulation: Some(2),
            data_parallel: Some(3),
            steps: Some(5),
            eval_every: Some(0),
            eval_batches: Some(1),
            device_memory: Some("256MiB".parse().unwrap()),
            seed: Some(4),
            workers: Some(workers),
            prefetch: Some(3),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        let device = Device::cpu(c.device_memory, AllocatorConfig::default());
        let mut t = Trainer::on_rank(c, &corpus, device, Box::new(comm)).unwrap();
        let r = t.train(&mut |_| {}).unwrap();
        let bits = r.losses.iter().map(|l| l.to_bits()).collect();
        (bits, r.loader.clone().unwrap())
    });
    results.into_iter().map(Result::unwrap).collect()
}

#[test]
fn data_parallel_ranks_prefetch_their_own_shard_and_train_bitwise_the_same() {
    let expected = ddp_run(0);
    for (rank, (losses, loader)) in ddp_run(2).into_iter().enumerate() {
        assert_eq!(losses, expected[rank].0, "rank {rank}");
        // Each rank drew its 2 micro-batches per step, all of them predicted.
        assert_eq!(loader.batches, 5 * 2);
        assert_eq!(loader.restarts, 0, "rank {rank}");
        assert!(loader.peak_queue <= 3);
    }
}

#[test]
fn a_vocabulary_larger_than_the_model_embeds_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.bin");
    // A subword-sized vocabulary: u16 tokens up to 999; the presets embed 256.
    let ids: Vec<u32> = (0..20_000).map(|i| i % 1000).collect();
    write_tokens(&path, 1000, &ids);
    let config = TrainConfig {
        model: Some("gpt-tiny".into()),
        data: Some(path.clone()),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    let e = Trainer::new(config, &Corpus::prepared(&path))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("wide.bin") && e.contains("1000") && e.contains("256") && e.contains("vocab"),
        "{e}"
    );
}

#[test]
fn wide_vocabularies_are_stored_as_u32() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("u32.bin");
    // 70,000 > 65,536 ids: four bytes per token.
    let ids = [0, 69_999, 65_536, 12];
    let h = write_tokens(&path, 70_000, &ids);
    assert_eq!(h.token_bytes, 4);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 + 4 * 4);
    let f = TokenFile::open(&path, Verify::Contents).unwrap();
    let mut out = [0; 4];
    f.read(0, &mut out).unwrap();
    assert_eq!(out, ids);
    // The writer refuses a token outside the vocabulary it was given.
    let mut w = TokenFileWriter::create(&dir.path().join("bad.bin"), 70_000).unwrap();
    assert!(w.push(&[70_000]).is_err());
}
