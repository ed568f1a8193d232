//! `headroom bench loader`: its arguments and the tables of the experiment
//! (`headroom_train::bench::loader`, which says what it measures).
//!
//! Not for: measuring (the train crate's `bench::loader`).

use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_train::bench::loader::{LoaderBench, LoaderOptions, measure};
use std::path::PathBuf;

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

pub fn run(args: LoaderBenchArgs) -> anyhow::Result<()> {
    let options = LoaderOptions {
        data: args.data,
        workers: args.workers,
        prefetch: args.prefetch,
        micro_batch: args.micro_batch,
        batches: args.batches,
        steps: args.steps,
        copy_bytes: args.copy_mib << 20,
    };
    let bench = measure(&options, &mut |label, workers| {
        if !args.json {
            eprintln!("measured {label} with {workers} workers");
        }
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        print_tables(&bench);
    }
    Ok(())
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
