//! Helpers shared by the data-parallel test files: a small deterministic run on gpt-tiny, its
//! outcome as bits, and a group of ranks on threads launched as `headroom train` launches them.

#![allow(dead_code)] // each test file uses its own subset

use headroom_comm::CollectiveCounts;
use headroom_memory::{Device, MemoryPeaks};
use headroom_train::Trainer;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::launch::{Inspect, LaunchOptions, launch_inspecting};
use headroom_train::prepare::{PrepareOptions, PreparedRun, prepare};
use headroom_train::report::TrainReport;
use headroom_train::strategy::{Optimizer, Pins, ZeroStage};
use std::sync::Arc;

/// gpt-tiny, 20 deterministic steps of `micro` × `accumulation` on each of `ranks` ranks.
pub fn config(optimizer: Optimizer, micro: usize, accumulation: usize, ranks: usize) -> RunConfig {
    TrainConfig {
        deterministic: Some(true),
        model: Some("gpt-tiny".into()),
        seq_len: Some(32),
        dropout: Some(0.0),
        optimizer: Some(optimizer),
        micro_batch: Some(micro),
        accumulation: Some(accumulation),
        data_parallel: Some(ranks),
        steps: Some(20),
        eval_every: Some(0),
        eval_batches: Some(1),
        device_memory: Some("256MiB".parse().unwrap()),
        seed: Some(11),
        ..Default::default()
    }
    .resolve()
    .unwrap()
}

/// `c` at ZeRO stage `stage`.
pub fn zero(c: RunConfig, stage: u8) -> RunConfig {
    let mut c = c;
    c.strategy.placement.zero_stage = ZeroStage::new(stage).unwrap();
    c
}

/// Losses and every weight of a finished run, as bits (every rank of a group must call it:
/// under ZeRO-3 the weights are gathered).
pub fn outcome(t: &mut Trainer) -> (Vec<u64>, Vec<u32>) {
    let losses = t.report().losses.iter().map(|l| l.to_bits()).collect();
    let weights = t
        .parameters_f32()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect();
    (losses, weights)
}

/// One rank's run: losses and weights (bits), its memory, what it communicated, the model's
/// block sizes and each block's weights' ranges in its flat buffer, and its report.
pub struct RankOutcome {
    pub bits: (Vec<u64>, Vec<u32>),
    pub memory: MemoryPeaks,
    pub counts: CollectiveCounts,
    pub blocks: Vec<usize>,
    pub weights: Vec<Vec<std::ops::Range<usize>>>,
    pub report: TrainReport,
}

/// Trains `c` on `ranks` threads (as `headroom train` launches them).
pub fn run_ranks(c: &RunConfig, ranks: usize) -> Vec<RankOutcome> {
    assert_eq!(c.data_parallel, ranks);
    let inspect: Inspect<RankOutcome> = Arc::new(|t| {
        let blocks = t.model().blocks().iter().map(|b| b.numel()).collect();
        let weights = t.model().blocks().iter().map(|b| b.ranges()).collect();
        // What training communicated, before gathering the weights to compare them.
        let counts = t.collective_counts().unwrap();
        let bits = outcome(t);
        Ok(RankOutcome {
            bits,
            memory: t.report().memory,
            counts,
            blocks,
            weights,
            report: t.report().clone(),
        })
    });
    launched(c, LaunchOptions::default(), inspect)
}

/// `c` prepared as `headroom train` prepares a run with nothing pinned and no search (the
/// configuration kept as it is), with the bundled corpus it trains on.
pub fn prepared(c: &RunConfig) -> (PreparedRun, Corpus) {
    let corpus = Corpus::bundled();
    let prepared = prepare(
        c.clone(),
        &corpus,
        &Pins::default(),
        PrepareOptions::default(),
    )
    .unwrap();
    assert_eq!(&prepared.config, c);
    (prepared, corpus)
}

/// Launches `c` as `headroom train` does, with `options`: what `inspect` made of each rank.
pub fn launched<T: Send + 'static>(
    c: &RunConfig,
    options: LaunchOptions,
    inspect: Inspect<T>,
) -> Vec<T> {
    let (prepared, corpus) = prepared(c);
    launch_inspecting(&prepared, Arc::new(corpus), options, inspect)
        .unwrap()
        .1
}

/// Bytes the allocator hands out for `bytes` (rounded up to 512).
pub fn rounded(bytes: usize) -> usize {
    bytes.div_ceil(512) * 512
}

/// Rank `rank`'s elements of a block of `p` over `ranks` (the last rank's shard is short).
pub fn owned(p: usize, rank: usize, ranks: usize) -> usize {
    let len = p.div_ceil(ranks);
    (len * (rank + 1)).min(p) - (len * rank).min(p)
}

/// Runs `c` on `ranks` threads, resuming from `resume` first when given, and saving at the end
/// into `save` when given (every rank joins; rank 0 writes); returns rank 0's weights.
pub fn run_saving(
    c: &RunConfig,
    ranks: usize,
    resume: Option<&std::path::Path>,
    save: Option<&std::path::Path>,
) -> Vec<u32> {
    assert_eq!(c.data_parallel, ranks);
    let save = save.map(|p| p.to_path_buf());
    let inspect: Inspect<Vec<u32>> = Arc::new(move |t| {
        if let Some(dir) = &save {
            t.save(dir)?;
        }
        Ok(outcome(t).1)
    });
    let options = LaunchOptions {
        resume: resume.map(|p| p.to_path_buf()),
        ..LaunchOptions::default()
    };
    launched(c, options, inspect).remove(0)
}

/// Trains `c` alone on a fresh device, on this thread (whose random stream a later save of the
/// trainer records), built from the prepared run as a launch builds it: its outcome (bits) and
/// the trainer, for tests of its state after the run.
pub fn run_alone(c: &RunConfig) -> ((Vec<u64>, Vec<u32>), Trainer) {
    let (prepared, corpus) = prepared(c);
    let device = Device::cpu(c.device_memory, c.allocator.config());
    let mut t = Trainer::prepared(&prepared, &corpus, device, None).unwrap();
    t.train(&mut |_| {}).unwrap();
    (outcome(&mut t), t)
}

/// The dry run of `c` predicts the real run's peak of every category exactly.
pub fn assert_dry_run_exact(c: &RunConfig, what: &str) {
    let predicted = headroom_train::predict::predict(c, &Corpus::bundled()).unwrap();
    let (_, t) = run_alone(c);
    assert_eq!(
        predicted.memory.peak_bytes_by_category,
        t.report().memory.peak_bytes_by_category,
        "{what}"
    );
}
