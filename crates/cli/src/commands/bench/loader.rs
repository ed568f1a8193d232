//! `headroom bench loader`: the data pipeline on this machine. Three measurements:
//!
//! - the loader alone: batches drawn as fast as it gives them, per number of workers, in
//!   tokens/s next to what each model's training consumes;
//! - training: the share of step time the trainer waits for data with each number of workers,
//!   on the default model and on a model small enough to be input-bound;
//! - the copy into device memory (tagged `input`) from a page-locked staging buffer against a
//!   pageable one.
//!
//! Not for: correctness (the loader's tests hold batches identical for any workers).

use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_memory::host_pool::HostPool;
use headroom_memory::{AllocatorConfig, ByteSize, Category, Device};
use headroom_tensor::{DType, Tensor};
use headroom_train::Trainer;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::source::run_loader;
use headroom_train::data::token_file::is_token_file;
use headroom_train::data::{Corpus, LoaderReport};
use headroom_train::model_spec;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct LoaderBenchArgs {
    /// A prepared token file or a text file (default: the bundled corpus).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Numbers of worker threads to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    pub workers: Vec<usize>,
    /// Batches queued ahead with workers.
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Sequences per batch.
    #[arg(long, default_value_t = 16)]
    pub micro_batch: usize,
    /// Batches the loader alone draws per measurement.
    #[arg(long, default_value_t = 2000)]
    pub batches: u64,
    /// Optimizer steps per training measurement.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    /// MiB copied per bandwidth measurement (repeated 20 times; the median is kept).
    #[arg(long, default_value_t = 64)]
    pub copy_mib: u64,
    /// One JSON object on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// The default model, and one small enough that drawing batches is a visible part of a step.
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

pub fn run(args: LoaderBenchArgs) -> anyhow::Result<()> {
    let corpus = match &args.data {
        Some(path) if is_token_file(path) => Corpus::prepared(path),
        Some(path) => Corpus::from_file(path)?,
        None => Corpus::bundled(),
    };
    let mut rows = Vec::new();
    for (label, model, layers) in MODELS {
        for &workers in &args.workers {
            let config = TrainConfig {
                model: Some(model.into()),
                layers,
                micro_batch: Some(args.micro_batch),
                steps: Some(args.steps),
                eval_every: Some(0),
                eval_batches: Some(1),
                device_memory: Some(ByteSize(4 << 30)),
                data: args.data.clone(),
                workers: Some(workers),
                prefetch: Some(args.prefetch),
                ..Default::default()
            }
            .resolve()?;
            let (loader_tokens_per_s, seq_len) = loader_alone(&config, &corpus, args.batches)?;
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
            if !args.json {
                eprintln!("measured {label} with {workers} workers");
            }
        }
    }
    let copy = [true, false]
        .into_iter()
        .map(|pin| copy_bandwidth(args.copy_mib << 20, pin))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bench = LoaderBench {
        data: corpus.name.clone(),
        rows,
        copy,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        print_tables(&bench);
    }
    Ok(())
}

/// Tokens per second the loader alone gives (each batch dropped at once), and the sequence
/// length.
fn loader_alone(config: &RunConfig, corpus: &Corpus, batches: u64) -> anyhow::Result<(f64, usize)> {
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
fn copy_bandwidth(bytes: u64, pin: bool) -> anyhow::Result<CopyRow> {
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
    times.sort_by(f64::total_cmp);
    let stats = pool.stats();
    Ok(CopyRow {
        staging: if pin { "page-locked" } else { "pageable" }.into(),
        pinned: staging.is_pinned(),
        pin_error: stats.pin_error,
        gb_per_s: bytes as f64 / times[times.len() / 2] / 1e9,
    })
}

fn print_tables(b: &LoaderBench) {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "model",
        "workers",
        "loader alone (tokens/s)",
        "training (tokens/s)",
        "loader / training",
        "step time waiting for data",
        "queue peak",
        "loader buffers",
    ]);
    for r in &b.rows {
        t.add_row(vec![
            r.model.clone(),
            r.workers.to_string(),
            format!("{:.3e}", r.loader_tokens_per_s),
            format!("{:.0}", r.train_tokens_per_s),
            format!(
                "{:.0}×",
                r.loader_tokens_per_s / r.train_tokens_per_s.max(1e-9)
            ),
            format!("{:.2} %", 100.0 * r.data_wait_fraction),
            r.loader.peak_queue.to_string(),
            headroom_memory::format_bytes(r.loader.buffer_bytes),
        ]);
    }
    println!("Data loader on {}:", b.data);
    println!("{t}");
    let mut c = Table::new();
    c.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "staging buffer",
        "locked",
        "copy into device memory",
    ]);
    for r in &b.copy {
        c.add_row(vec![
            r.staging.clone(),
            match (&r.pinned, &r.pin_error) {
                (true, _) => "yes".to_string(),
                (false, Some(why)) => format!("no: {why}"),
                (false, None) => "no".to_string(),
            },
            format!("{:.2} GB/s", r.gb_per_s),
        ]);
    }
    println!("{c}");
}
