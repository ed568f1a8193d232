//! `headroom bench offload`: what offload costs on this machine. Four measurements:
//!
//! - the host optimizer step (AdamW, parameters per second) on an offload region, against the
//!   engine's own step on device buffers and against a plain single-threaded loop;
//! - the copy between device memory and a page-locked host buffer (the role PCIe plays on a
//!   GPU), in both directions;
//! - the disk tier: a store's regions written and read back through its swap buffers and I/O
//!   workers, against plain sequential I/O of the same bytes in the same directory;
//! - training: the step time of each offload mode against none on the default model, and on a
//!   larger one under a device budget it only fits with offload.
//!
//! `--write-hardware FILE` writes the measured rates as `headroom plan --hardware` keys
//! (`cpu_optimizer_params_per_s`, `pcie_bandwidth_gbps`, `nvme_bandwidth_gbps`), so the
//! planner's offload times use this machine's figures instead of its defaults.
//!
//! The training rows are measured in `offload_training`.
//!
//! Not for: correctness (the offload tests hold losses bitwise and bytes exact).

use anyhow::Context;
use clap::Args;
use headroom_memory::host_pool::HostPool;
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::grad::Grads;
use headroom_nn::optim::{FlatParams, Optimizer, OptimizerConfig, UpdateRule};
use headroom_offload::{AlignedBytes, OffloadStore, Part, StoreOptions, TierKind};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

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

#[derive(Debug, Serialize)]
struct UpdateRates {
    parameters: usize,
    engine_device_step: f64,
    host_offload_step: f64,
    plain_loop: f64,
}

#[derive(Debug, Serialize)]
struct CopyRates {
    bytes: usize,
    device_to_host_gb_per_s: f64,
    host_to_device_gb_per_s: f64,
    pinned: bool,
}

#[derive(Debug, Serialize)]
struct DiskRates {
    dir: String,
    bytes: usize,
    direct_io: bool,
    buffered_reason: Option<String>,
    store_write_gb_per_s: f64,
    store_read_gb_per_s: f64,
    plain_write_gb_per_s: f64,
    plain_read_gb_per_s: f64,
}

#[derive(Debug, Serialize)]
struct OffloadBench {
    update: UpdateRates,
    copy: CopyRates,
    disk: DiskRates,
    training: Vec<super::offload_training::TrainingRow>,
}

pub fn run(args: OffloadBenchArgs) -> anyhow::Result<()> {
    let update = update_rates(args.params_millions * 1_000_000)?;
    let copy = copy_rates(64 << 20)?;
    let dir = args.offload_dir.clone().unwrap_or_else(std::env::temp_dir);
    let disk = disk_rates(&dir, args.disk_mib << 20)?;
    let training = match args.steps {
        0 => Vec::new(),
        steps => super::offload_training::training(steps, &dir)?,
    };
    let bench = OffloadBench {
        update,
        copy,
        disk,
        training,
    };
    if let Some(path) = &args.write_hardware {
        let toml = format!(
            "# Measured by `headroom bench offload` on this machine.\ncpu_optimizer_params_per_s = {:.4e}\npcie_bandwidth_gbps = {:.3}\nnvme_bandwidth_gbps = {:.3}\n",
            bench.update.host_offload_step,
            bench
                .copy
                .device_to_host_gb_per_s
                .min(bench.copy.host_to_device_gb_per_s),
            bench
                .disk
                .store_write_gb_per_s
                .min(bench.disk.store_read_gb_per_s),
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

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `f` over 5 runs after a warm-up.
fn timed(mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    f()?;
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        f()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(median(times))
}

/// A plain AdamW step: one thread, indexed loop, the textbook formula.
fn plain_adamw(w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], lr: f32, step: i32) {
    let (b1, b2, eps, wd) = (0.9f32, 0.999f32, 1e-8f32, 0.01f32);
    let (bc1, bc2) = (1.0 - b1.powi(step), 1.0 - b2.powi(step));
    for i in 0..w.len() {
        w[i] *= 1.0 - lr * wd;
        m[i] = b1 * m[i] + (1.0 - b1) * g[i];
        v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
        w[i] -= lr * (m[i] / bc1) / ((v[i] / bc2).sqrt() + eps);
    }
}

/// AdamW parameters per second: the engine's step on device buffers, the offloaded step on a
/// host region, and a plain loop.
fn update_rates(n: usize) -> anyhow::Result<UpdateRates> {
    let grads: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) * 1e-3).collect();
    // One weight spanning the buffer (only LAMB reads weight ranges).
    let ranges = vec![std::ops::Range { start: 0, end: n }];
    let config = OptimizerConfig::new(UpdateRule::AdamW);
    // On the device: the optimizer's own state buffers.
    let device = Device::cpu(4 * 4 * n as u64 + (64 << 20), AllocatorConfig::default());
    let mut params = vec![0.5f32; n];
    let mut on_device = Optimizer::new(config, device);
    let device_s = timed(|| {
        on_device.begin_step();
        let mut group = FlatParams {
            params: &mut params,
            grads: Grads::F32(&grads),
            tensors: &ranges,
        };
        on_device.update_group(0, &mut group, 1.0, 1e-3)?;
        Ok(())
    })?;
    // On the host: one region of master weights and two states, as the trainer lays it out.
    let pool = HostPool::new(None, true);
    let mut store = OffloadStore::new(
        pool,
        StoreOptions {
            name: "bench".into(),
            tier: TierKind::Host,
            dir: None,
            swap_buffers: 3,
            io_workers: 2,
            dry: false,
        },
    )?;
    let parts = [
        Category::MasterWeight,
        Category::OptimizerState,
        Category::OptimizerState,
    ]
    .map(|category| Part {
        category,
        bytes: 4 * n,
    });
    store.add_region(parts.to_vec(), |mut r| {
        bytemuck::cast_slice_mut::<_, f32>(&mut *r.parts[0]).fill(0.5)
    })?;
    let mut host = Optimizer::new(config, Device::cpu(1 << 20, AllocatorConfig::default()));
    let host_s = timed(|| {
        host.begin_step();
        store.visit(&[0], |_, r| -> anyhow::Result<()> {
            let mut parts = r.expect("a real store").parts;
            let (master, states) = parts.split_first_mut().expect("three parts");
            let mut group = FlatParams {
                params: bytemuck::cast_slice_mut(master),
                grads: Grads::F32(&grads),
                tensors: &ranges,
            };
            let mut states: Vec<&mut [u8]> = states.iter_mut().map(|s| &mut **s).collect();
            host.update_external(&mut states, &mut group, 1.0, 1e-3, None);
            Ok(())
        })
    })?;
    let (mut w, mut m, mut v) = (vec![0.5f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let mut step = 0;
    let plain_s = timed(|| {
        step += 1;
        plain_adamw(&mut w, &grads, &mut m, &mut v, 1e-3, step);
        Ok(())
    })?;
    Ok(UpdateRates {
        parameters: n,
        engine_device_step: n as f64 / device_s,
        host_offload_step: n as f64 / host_s,
        plain_loop: n as f64 / plain_s,
    })
}

/// Device → host and host → device copies of `bytes` with a page-locked host buffer.
fn copy_rates(bytes: usize) -> anyhow::Result<CopyRates> {
    let device = Device::cpu(2 * bytes as u64, AllocatorConfig::default());
    let mut on_device = device.alloc(bytes as u64, Category::Gradient, Some("bench"))?;
    on_device.as_bytes_mut().expect("backed").fill(3);
    let pool = HostPool::new(None, true);
    let mut host = AlignedBytes::new(&pool, bytes)?;
    let d2h = timed(|| {
        host.as_bytes_mut()[..bytes].copy_from_slice(on_device.as_bytes().expect("backed"));
        Ok(())
    })?;
    let h2d = timed(|| {
        on_device
            .as_bytes_mut()
            .expect("backed")
            .copy_from_slice(&host.as_bytes()[..bytes]);
        Ok(())
    })?;
    Ok(CopyRates {
        bytes,
        device_to_host_gb_per_s: bytes as f64 / d2h / 1e9,
        host_to_device_gb_per_s: bytes as f64 / h2d / 1e9,
        pinned: host.is_pinned(),
    })
}

/// The disk tier against plain sequential I/O of the same bytes in `dir`.
fn disk_rates(dir: &std::path::Path, bytes: usize) -> anyhow::Result<DiskRates> {
    const REGION: usize = 16 << 20;
    let regions = bytes.div_ceil(REGION).max(1);
    let bytes = regions * REGION;
    let pool = HostPool::new(None, true);
    let mut store = OffloadStore::new(
        pool.clone(),
        StoreOptions {
            name: "bench-offload".into(),
            tier: TierKind::Disk,
            dir: Some(dir.to_path_buf()),
            swap_buffers: 3,
            io_workers: 2,
            dry: false,
        },
    )?;
    let part = vec![Part {
        category: Category::OptimizerState,
        bytes: REGION,
    }];
    let t0 = Instant::now();
    for r in 0..regions {
        store.add_region(part.clone(), |mut m| m.parts[0].fill(r as u8))?;
    }
    store.wait_idle()?;
    let write_s = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    for r in 0..regions {
        if r + 1 < regions {
            store.prefetch(r + 1)?;
        }
        store.read(r, |m| m.map(|m| m.parts[0][0]))?;
    }
    let read_s = t0.elapsed().as_secs_f64();
    let stats = store.stats();
    drop(store);
    // Plain: one thread, 1 MiB at a time, the same open flags the store was granted.
    let path = dir.join("bench-plain.bin");
    let direct = stats.direct_io;
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(if direct { libc::O_DIRECT } else { 0 })
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?
    };
    let chunk = 1 << 20;
    let mut buffer = AlignedBytes::new(&pool, chunk)?;
    buffer.as_bytes_mut().fill(7);
    let t0 = Instant::now();
    {
        use std::os::unix::fs::FileExt;
        for k in 0..bytes / chunk {
            file.write_all_at(buffer.as_bytes(), (k * chunk) as u64)?;
        }
        file.sync_data()?;
    }
    let plain_write_s = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    {
        use std::os::unix::fs::FileExt;
        for k in 0..bytes / chunk {
            file.read_exact_at(buffer.as_bytes_mut(), (k * chunk) as u64)?;
        }
    }
    let plain_read_s = t0.elapsed().as_secs_f64();
    drop(file);
    let _ = std::fs::remove_file(&path);
    Ok(DiskRates {
        dir: dir.display().to_string(),
        bytes,
        direct_io: direct,
        buffered_reason: stats.buffered_reason,
        store_write_gb_per_s: bytes as f64 / write_s / 1e9,
        store_read_gb_per_s: bytes as f64 / read_s / 1e9,
        plain_write_gb_per_s: bytes as f64 / plain_write_s / 1e9,
        plain_read_gb_per_s: bytes as f64 / plain_read_s / 1e9,
    })
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
    super::offload_training::print_training(&b.training);
}
