//! The data pipeline on this machine. Three measurements:
//!
//! - the loader alone: batches drawn as fast as it gives them, per number of workers, in
//!   tokens/s next to what each model's training consumes;
//! - training: the share of step time the trainer waits for data with each number of workers,
//!   on the default model and on a model small enough to be input-bound;
//! - the copy into device memory (tagged `input`) from a page-locked staging buffer against a
//!   pageable one.
//!
//! Not for: correctness (the loader's tests hold batches identical for any workers).

use super::{BenchError, median};
use crate::config::{RunConfig, TrainConfig};
use crate::data::source::run_loader;
use crate::data::token_file::is_token_file;
use crate::data::{Corpus, LoaderReport};
use crate::{Trainer, model_spec};
use headroom_memory::host_pool::HostPool;
use headroom_memory::{AllocatorConfig, ByteSize, Category, Device};
use headroom_tensor::{DType, Tensor};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct LoaderOptions {
    /// A prepared token file or a text file (`None`: the bundled corpus).
    pub data: Option<PathBuf>,
    /// Numbers of worker threads to measure.
    pub workers: Vec<usize>,
    /// Batches queued ahead with workers.
    pub prefetch: usize,
    /// Sequences per batch.
    pub micro_batch: usize,
    /// Batches the loader alone draws per measurement.
    pub batches: u64,
    /// Optimizer steps per training measurement.
    pub steps: u64,
    /// Bytes copied per bandwidth measurement (repeated 20 times; the median is kept).
    pub copy_bytes: u64,
}

/// The default model, and one small enough that drawing batches is a visible part of a step:
/// (label, model, layers).
const MODELS: [(&str, &str, Option<usize>); 2] = [
    ("default", "gpt-small", None),
    ("input-bound", "gpt-tiny", Some(1)),
];

#[derive(Debug, Clone, Serialize)]
pub struct LoaderRow {
    pub model: String,
    pub seq_len: usize,
    pub workers: usize,
    /// The loader alone.
    pub loader_tokens_per_s: f64,
    /// Training with this many workers.
    pub train_tokens_per_s: f64,
    pub data_wait_fraction: f64,
    pub loader: LoaderReport,
}

#[derive(Debug, Clone, Serialize)]
pub struct CopyRow {
    pub staging: String,
    pub pinned: bool,
    pub pin_error: Option<String>,
    pub gb_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoaderBench {
    pub data: String,
    pub rows: Vec<LoaderRow>,
    pub copy: Vec<CopyRow>,
}

/// Runs the experiment; `on_measured(label, workers)` is called after each (model, workers)
/// pair is measured, with the label of `MODELS`.
pub fn measure(
    options: &LoaderOptions,
    on_measured: &mut dyn FnMut(&str, usize),
) -> Result<LoaderBench, BenchError> {
    let corpus = match &options.data {
        Some(path) if is_token_file(path) => Corpus::prepared(path),
        Some(path) => Corpus::from_file(path)?,
        None => Corpus::bundled(),
    };
    let mut rows = Vec::new();
    for (label, model, layers) in MODELS {
        for &workers in &options.workers {
            let config = TrainConfig {
                model: Some(model.into()),
                layers,
                micro_batch: Some(options.micro_batch),
                steps: Some(options.steps),
                eval_every: Some(0),
                eval_batches: Some(1),
                device_memory: Some(ByteSize(4 << 30)),
                data: options.data.clone(),
                workers: Some(workers),
                prefetch: Some(options.prefetch),
                ..Default::default()
            }
            .resolve()?;
            let (loader_tokens_per_s, seq_len) = loader_alone(&config, &corpus, options.batches)?;
            let mut trainer = Trainer::new(config, &corpus)?;
            let report = trainer.train(&mut |_| {})?;
            rows.push(LoaderRow {
                model: format!(
                    "{label} ({model}{})",
                    layers.map_or(String::new(), |l| format!(", {l} layer"))
                ),
                seq_len,
                workers,
                loader_tokens_per_s,
                train_tokens_per_s: report.tokens_per_s,
                data_wait_fraction: report.data_wait_fraction().unwrap_or(0.0),
                loader: report.loader.clone().unwrap_or_default(),
            });
            on_measured(label, workers);
        }
    }
    let copy = [true, false]
        .into_iter()
        .map(|pin| copy_bandwidth(options.copy_bytes, pin))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LoaderBench {
        data: corpus.name.clone(),
        rows,
        copy,
    })
}

/// Tokens per second the loader alone gives (each batch dropped at once), and the sequence
/// length.
fn loader_alone(
    config: &RunConfig,
    corpus: &Corpus,
    batches: u64,
) -> Result<(f64, usize), BenchError> {
    let spec = model_spec(config)?;
    let seq_len = config.seq_len_of(&spec);
    let mut loader = run_loader(config, corpus, &spec, seq_len, (0, 1), false)?;
    let started = Instant::now();
    for _ in 0..batches {
        drop(loader.next_batch(config.micro_batch())?);
    }
    let tokens = (batches as usize * config.micro_batch() * seq_len) as f64;
    Ok((tokens / started.elapsed().as_secs_f64(), seq_len))
}

/// GB/s of `bytes` copied into device memory (as `input`) from a staging buffer, page-locked
/// or pageable: the median of 20 copies after one warm-up copy.
fn copy_bandwidth(bytes: u64, pin: bool) -> Result<CopyRow, BenchError> {
    let n = (bytes / 8) as usize;
    let pool = HostPool::new(None, pin);
    let mut staging = pool.alloc::<i64>(n)?;
    for (i, v) in staging.iter_mut().enumerate() {
        *v = (i % 256) as i64;
    }
    let device = Device::cpu(4 * bytes, AllocatorConfig::default());
    let mut times = Vec::new();
    for rep in 0..21 {
        let t0 = Instant::now();
        let t = Tensor::from_i64(&device, &[n], &staging, DType::I64, Category::Input, None)?;
        let dt = t0.elapsed().as_secs_f64();
        drop(t);
        if rep > 0 {
            times.push(dt);
        }
    }
    let stats = pool.stats();
    Ok(CopyRow {
        staging: if pin { "page-locked" } else { "pageable" }.into(),
        pinned: staging.is_pinned(),
        pin_error: stats.pin_error,
        gb_per_s: bytes as f64 / median(&mut times) / 1e9,
    })
}
