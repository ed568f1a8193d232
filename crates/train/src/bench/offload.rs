//! What offload costs on this machine. Four measurements:
//!
//! - the host optimizer step (AdamW, parameters per second) on an offload region, against the
//!   engine's own step on device buffers and against a plain single-threaded loop;
//! - the copy between device memory and a page-locked host buffer (the role PCIe plays on a
//!   GPU), in both directions;
//! - the disk tier: a store's regions written and read back through its swap buffers and I/O
//!   workers, against plain sequential I/O of the same bytes in the same directory;
//! - training: the step time of each offload mode against none (`offload_training`).
//!
//! The rates are what `headroom plan --hardware` reads as `cpu_optimizer_params_per_s`,
//! `pcie_bandwidth_gbps` and `nvme_bandwidth_gbps` (`OffloadBench::hardware_rates`).
//!
//! Not for: correctness (the offload tests hold losses bitwise and bytes exact).

use super::offload_training::{TrainingRow, training};
use super::{BenchError, median};
use headroom_memory::host_pool::HostPool;
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::grad::Grads;
use headroom_nn::optim::{FlatParams, Optimizer, OptimizerConfig, UpdateRule};
use headroom_offload::{AlignedBytes, OffloadStore, Part, StoreOptions, TierKind};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct OffloadOptions {
    /// Parameters in the optimizer-step measurement.
    pub parameters: usize,
    /// Bytes written and read in the disk measurement (rounded up to 16 MiB regions).
    pub disk_bytes: usize,
    /// Directory for the disk tier's files.
    pub dir: PathBuf,
    /// Optimizer steps per training measurement (0 skips training).
    pub steps: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct UpdateRates {
    pub parameters: usize,
    pub engine_device_step: f64,
    pub host_offload_step: f64,
    pub plain_loop: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CopyRates {
    pub bytes: usize,
    pub device_to_host_gb_per_s: f64,
    pub host_to_device_gb_per_s: f64,
    pub pinned: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct DiskRates {
    pub dir: String,
    pub bytes: usize,
    pub direct_io: bool,
    pub buffered_reason: Option<String>,
    pub store_write_gb_per_s: f64,
    pub store_read_gb_per_s: f64,
    pub plain_write_gb_per_s: f64,
    pub plain_read_gb_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct OffloadBench {
    pub update: UpdateRates,
    pub copy: CopyRates,
    pub disk: DiskRates,
    pub training: Vec<TrainingRow>,
}

/// The planner's hardware rates, as measured here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HardwareRates {
    /// The offloaded host update's parameters per second.
    pub cpu_optimizer_params_per_s: f64,
    /// The slower direction of the device ↔ host copies, GB/s.
    pub pcie_bandwidth_gbps: f64,
    /// The slower of the disk tier's write and read, GB/s.
    pub nvme_bandwidth_gbps: f64,
}

impl OffloadBench {
    /// The rates `headroom plan --hardware` reads: each link at its slower direction.
    pub fn hardware_rates(&self) -> HardwareRates {
        HardwareRates {
            cpu_optimizer_params_per_s: self.update.host_offload_step,
            pcie_bandwidth_gbps: self
                .copy
                .device_to_host_gb_per_s
                .min(self.copy.host_to_device_gb_per_s),
            nvme_bandwidth_gbps: self
                .disk
                .store_write_gb_per_s
                .min(self.disk.store_read_gb_per_s),
        }
    }
}

/// Runs the four measurements.
pub fn measure(options: &OffloadOptions) -> Result<OffloadBench, BenchError> {
    let update = update_rates(options.parameters)?;
    let copy = copy_rates(64 << 20)?;
    let disk = disk_rates(&options.dir, options.disk_bytes)?;
    let training = match options.steps {
        0 => Vec::new(),
        steps => training(steps, &options.dir)?,
    };
    Ok(OffloadBench {
        update,
        copy,
        disk,
        training,
    })
}

/// Median seconds of `f` over 5 runs after a warm-up.
fn timed(mut f: impl FnMut() -> Result<(), BenchError>) -> Result<f64, BenchError> {
    f()?;
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        f()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(median(&mut times))
}

/// A plain AdamW step: one thread, indexed loop, the textbook formula (Loshchilov and Hutter,
/// 2019, decoupled weight decay 0.01).
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
fn update_rates(n: usize) -> Result<UpdateRates, BenchError> {
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
        store.visit(&[0], |_, r| -> Result<(), BenchError> {
            let mut parts = r.expect("a host store's regions are real").parts;
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
fn copy_rates(bytes: usize) -> Result<CopyRates, BenchError> {
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
fn disk_rates(dir: &Path, bytes: usize) -> Result<DiskRates, BenchError> {
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
    let io = |action: &'static str| {
        let path = path.clone();
        move |source| BenchError::File {
            action,
            path,
            source,
        }
    };
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(if direct { libc::O_DIRECT } else { 0 })
            .open(&path)
            .map_err(io("creating"))?
    };
    let chunk = 1 << 20;
    let mut buffer = AlignedBytes::new(&pool, chunk)?;
    buffer.as_bytes_mut().fill(7);
    let t0 = Instant::now();
    {
        use std::os::unix::fs::FileExt;
        for k in 0..bytes / chunk {
            file.write_all_at(buffer.as_bytes(), (k * chunk) as u64)
                .map_err(io("writing"))?;
        }
        file.sync_data().map_err(io("writing"))?;
    }
    let plain_write_s = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    {
        use std::os::unix::fs::FileExt;
        for k in 0..bytes / chunk {
            file.read_exact_at(buffer.as_bytes_mut(), (k * chunk) as u64)
                .map_err(io("reading"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_adamw_takes_the_textbook_first_step() {
        // At step 1 the bias-corrected moments are g and g², so the update is
        // lr · g / (|g| + ε) after decay: w ← w (1 − lr·wd) − lr · sign(g) (to within ε).
        let (lr, wd) = (1e-3f32, 0.01f32);
        let g = [0.5f32, -2.0, 0.0];
        let mut w = [1.0f32, 1.0, 1.0];
        let (mut m, mut v) = ([0.0f32; 3], [0.0f32; 3]);
        plain_adamw(&mut w, &g, &mut m, &mut v, lr, 1);
        let decayed = 1.0 - lr * wd;
        for (got, want) in w.iter().zip([decayed - lr, decayed + lr, decayed]) {
            assert!((got - want).abs() < 1e-6, "{got} against {want}");
        }
        // The moments: (1 − β₁)·g and (1 − β₂)·g².
        assert!((m[1] - 0.1 * -2.0).abs() < 1e-7);
        assert!((v[1] - 0.001 * 4.0).abs() < 1e-7);
    }

    #[test]
    fn hardware_rates_take_each_link_at_its_slower_direction() {
        let bench = OffloadBench {
            update: UpdateRates {
                parameters: 1,
                engine_device_step: 5.0,
                host_offload_step: 7.0,
                plain_loop: 3.0,
            },
            copy: CopyRates {
                bytes: 1,
                device_to_host_gb_per_s: 12.0,
                host_to_device_gb_per_s: 9.0,
                pinned: true,
            },
            disk: DiskRates {
                dir: String::new(),
                bytes: 1,
                direct_io: true,
                buffered_reason: None,
                store_write_gb_per_s: 1.5,
                store_read_gb_per_s: 2.5,
                plain_write_gb_per_s: 4.0,
                plain_read_gb_per_s: 0.5,
            },
            training: Vec::new(),
        };
        assert_eq!(
            bench.hardware_rates(),
            HardwareRates {
                cpu_optimizer_params_per_s: 7.0,
                pcie_bandwidth_gbps: 9.0,
                nvme_bandwidth_gbps: 1.5,
            }
        );
    }
}
