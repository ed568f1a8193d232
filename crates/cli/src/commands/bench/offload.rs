//! `headroom bench offload`: its arguments, the tables of the experiment
//! (`headroom_train::bench::offload`, which says what it measures), and `--write-hardware FILE`,
//! which writes the measured rates as `headroom plan --hardware` keys
//! (`cpu_optimizer_params_per_s`, `pcie_bandwidth_gbps`, `nvme_bandwidth_gbps`), so the
//! planner's offload times use this machine's figures instead of its defaults.
//!
//! Not for: measuring (the train crate's `bench::offload` and `bench::offload_training`).

use anyhow::Context;
use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_train::bench::offload::{OffloadBench, OffloadOptions, measure};
use headroom_train::bench::offload_training::TrainingRow;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct OffloadBenchArgs {
    /// Millions of parameters in the optimizer-step measurement.
    #[arg(long, default_value_t = 16)]
    pub params_millions: usize,
    /// MiB written and read in the disk measurement.
    #[arg(long, default_value_t = 256)]
    pub disk_mib: usize,
    /// Directory for the disk tier's files (default: the system's temporary directory).
    #[arg(long, value_name = "DIR")]
    pub offload_dir: Option<PathBuf>,
    /// Optimizer steps per training measurement (0 skips training).
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Write the measured rates as a `headroom plan --hardware` file.
    #[arg(long, value_name = "FILE")]
    pub write_hardware: Option<PathBuf>,
    /// One JSON object on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: OffloadBenchArgs) -> anyhow::Result<()> {
    let options = OffloadOptions {
        parameters: args.params_millions * 1_000_000,
        disk_bytes: args.disk_mib << 20,
        dir: args.offload_dir.unwrap_or_else(std::env::temp_dir),
        steps: args.steps,
    };
    let bench = measure(&options)?;
    if let Some(path) = &args.write_hardware {
        let rates = bench.hardware_rates();
        let toml = format!(
            "# Measured by `headroom bench offload` on this machine.\ncpu_optimizer_params_per_s = {:.4e}\npcie_bandwidth_gbps = {:.3}\nnvme_bandwidth_gbps = {:.3}\n",
            rates.cpu_optimizer_params_per_s, rates.pcie_bandwidth_gbps, rates.nvme_bandwidth_gbps,
        );
        std::fs::write(path, toml)
            .with_context(|| format!("--write-hardware {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        print_tables(&bench);
    }
    Ok(())
}

fn print_tables(b: &OffloadBench) {
    let u = &b.update;
    println!(
        "AdamW step over {} parameters (parameters/s): engine on device buffers {:.3e}, offloaded on a host region {:.3e} ({:.2}× the engine), plain loop {:.3e} ({:.2}× the plain loop).",
        u.parameters,
        u.engine_device_step,
        u.host_offload_step,
        u.host_offload_step / u.engine_device_step,
        u.plain_loop,
        u.host_offload_step / u.plain_loop
    );
    let c = &b.copy;
    println!(
        "Device ↔ host copies of {} MiB ({}): device → host {:.2} GB/s, host → device {:.2} GB/s.",
        c.bytes >> 20,
        if c.pinned {
            "page-locked"
        } else {
            "pageable: locking refused"
        },
        c.device_to_host_gb_per_s,
        c.host_to_device_gb_per_s
    );
    let d = &b.disk;
    println!(
        "Disk tier in {} ({} MiB, {}): store write {:.2} GB/s, read {:.2} GB/s; plain sequential write {:.2} GB/s, read {:.2} GB/s (store / plain: {:.2}× write, {:.2}× read).",
        d.dir,
        d.bytes >> 20,
        match (&d.buffered_reason, d.direct_io) {
            (_, true) => "direct I/O".to_string(),
            (Some(why), false) => why.clone(),
            (None, false) => "buffered I/O".to_string(),
        },
        d.store_write_gb_per_s,
        d.store_read_gb_per_s,
        d.plain_write_gb_per_s,
        d.plain_read_gb_per_s,
        d.store_write_gb_per_s / d.plain_write_gb_per_s,
        d.store_read_gb_per_s / d.plain_read_gb_per_s
    );
    print_training(&b.training);
}

/// The step-time table (nothing when training was skipped).
fn print_training(rows: &[TrainingRow]) {
    if rows.is_empty() {
        return;
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "model",
        "offload",
        "device budget",
        "step (s)",
        "× none",
        "device peak",
        "host",
        "disk",
        "transfers hidden",
    ]);
    let bytes = headroom_memory::format_bytes;
    for r in rows {
        let mut row = vec![
            r.model.clone(),
            r.mode.clone(),
            r.device_budget.map_or("-".into(), bytes),
        ];
        match r.fits {
            false => row.extend([
                "does not fit".to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]),
            true => row.extend([
                format!("{:.3}", r.step_s),
                r.vs_none.map_or("-".into(), |x| format!("{x:.2}")),
                bytes(r.peak_device_bytes),
                bytes(r.host_bytes),
                bytes(r.disk_bytes),
                r.hidden_fraction
                    .map_or("-".into(), |h| format!("{:.0} %", 100.0 * h)),
            ]),
        }
        t.add_row(row);
    }
    println!("{t}");
}
