//! How fast this machine runs headroom's kernels, measured, and the step time of a counted
//! amount of work. A dry run counts a step's work (matmul FLOPs by input width, fused-attention
//! FLOPs, element-wise bytes, kernel calls; recomputation included); the same small workloads
//! are counted on a shape-only device and timed on the CPU backend, so each rate is work over
//! time in the same units as the count:
//!
//! - per-kernel overhead: a one-element `add`;
//! - element-wise bandwidth per storage width (f32, bf16, f16: 16-bit values are widened one by
//!   one, which costs more than their bytes): an `add` of two tensors of the model's activation
//!   size (micro-batch × sequence × width), less the overhead;
//! - matmul FLOP/s per input width (16-bit inputs widened around the GEMM, as the engine does):
//!   forward and backward of the model's own largest linear layer (micro-batch × sequence rows,
//!   width × FFN), so backward's transposed operands count as in a step;
//! - fused-attention FLOP/s: forward and backward at the model's head shape (GPTs only);
//! - data-parallel runs: a collective's fixed cost (a one-element all-reduce) and the elements
//!   per second a rank sends on a ring (a reduce-scatter, an all-gather and an all-reduce of a
//!   block's size), on an in-process group of the run's world size;
//! - the optimizer step: AdamW's update per parameter with f32, bf16 and 8-bit states over a
//!   flat buffer of 2¹⁸ parameters, and Adafactor's on a 512 × 512 matrix (other rules are
//!   charged AdamW's f32 rate), and host-tier copies (both in `step_rates`).
//!
//! The step time is the sum over widths of matmul FLOPs / R_width, plus attention FLOPs /
//! R_att, plus the sum over widths of bytes / BW_width, plus kernels × overhead, plus
//! collectives × their overhead and ring elements / R_comm (the engine's collectives are
//! synchronous: nothing overlaps them), plus the parameters the rank updates / R_update of
//! their state format, plus the bytes copied to and from the host tier / R_host. The model has
//! no overlap or cache effects; its error
//! against measured steps is in docs/benchmarks.md.
//!
//! Not for: memory (the dry run measures that) or GPU time (the planner's analytical model).

pub use super::step_rates::{UpdateKind, UpdateRates};
use super::step_rates::{measure_host_copy, measure_updates};
use headroom_comm::{Collective, CommError, Communicator, ThreadGroup};
use headroom_memory::{AllocatorConfig, Category, Device};
pub use headroom_plan::cost::StepTime;
use headroom_tensor::backend::work::{PerWidth, Work, count_work};
use headroom_tensor::{DType, Gradients, Result, Tape, Tensor};
use serde::Serialize;
use std::time::{Duration, Instant};

/// A rate per storage width.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Rates {
    pub f32: f64,
    pub bf16: f64,
    pub f16: f64,
}

impl Rates {
    fn per_width(&self) -> PerWidth {
        PerWidth {
            f32: self.f32,
            bf16: self.bf16,
            f16: self.f16,
        }
    }
}

/// Measured rates of this machine's CPU backend.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SpeedModel {
    pub matmul_flops_per_s: Rates,
    pub attention_flops_per_s: f64,
    pub elementwise_bytes_per_s: Rates,
    pub kernel_overhead_s: f64,
    /// Data-parallel runs: elements a rank sends per second on a ring (0: not measured, a
    /// single rank).
    pub collective_elements_per_s: f64,
    /// The fixed cost of one collective.
    pub collective_overhead_s: f64,
    /// AdamW's update, parameters per second, by state format.
    pub optimizer_params_per_s: UpdateRates,
    /// Bytes per second copied between device memory and a host-tier buffer (one direction).
    pub host_copy_bytes_per_s: f64,
}

/// The shapes the rates are measured at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CalibrationShapes {
    /// Rows, inner and output width of the model's largest matmul.
    pub matmul: (usize, usize, usize),
    /// Elements of a typical activation (micro-batch × sequence × width): element-wise kernels
    /// stream tensors of this size, often from cache rather than memory.
    pub activation_elements: usize,
    /// `(batch × heads, sequence, head width)` of the attention, if the model has one.
    pub attention: Option<(usize, usize, usize)>,
    /// `(world size, elements)` of a data-parallel run's collectives (a block's size).
    pub collectives: Option<(usize, usize)>,
}

/// How long each measurement repeats its workload (best of three such batches).
pub(super) const MEASURE_FOR: Duration = Duration::from_millis(15);

impl SpeedModel {
    /// Measures the rates at `shapes` (a few tenths of a second).
    pub fn measure(shapes: CalibrationShapes) -> Result<SpeedModel> {
        let small = calibrate(|d| {
            let a = filled(d, &[1], DType::F32)?;
            a.add(&a).map(drop)
        })?;
        let overhead = small.seconds / small.work.kernels.max(1) as f64;
        let elements = shapes.activation_elements.max(1);
        let stream = |dtype| -> Result<f64> {
            let run = calibrate(move |d| {
                let a = filled(d, &[elements], dtype)?;
                let b = filled(d, &[elements], dtype)?;
                a.add(&b).map(drop)
            })?;
            let bytes = run.work.elementwise_bytes.total();
            Ok(bytes / run.rest(overhead, None))
        };
        let bandwidth = Rates {
            f32: stream(DType::F32)?,
            bf16: stream(DType::BF16)?,
            f16: stream(DType::F16)?,
        };
        let (m, k, n) = shapes.matmul;
        // A linear layer's forward and backward: x·W, then dY·Wᵀ and Xᵀ·dY, so the transposed
        // operands of backward (which 16-bit inputs must widen through strided reads) weigh as
        // they do in a step.
        let gemm = |dtype| -> Result<f64> {
            let run = calibrate(move |d| {
                let x = filled(d, &[m, k], dtype)?.track();
                let w = filled(d, &[k, n], dtype)?.track();
                let tape = Tape::new();
                let loss = tape.record(|| x.matmul(&w)?.sum_all())?;
                let mut grads = Gradients::new();
                tape.backward(&loss, &mut grads)
            })?;
            Ok(run.work.matmul_flops.total() / run.rest(overhead, Some(&bandwidth)))
        };
        let matmul = Rates {
            f32: gemm(DType::F32)?,
            bf16: gemm(DType::BF16)?,
            f16: gemm(DType::F16)?,
        };
        let attention = match shapes.attention {
            Some((bh, t, hd)) => {
                let run = calibrate(move |d| {
                    let q = filled(d, &[1, bh, t, hd], DType::F32)?.track();
                    let tape = Tape::new();
                    let loss = tape.record(|| {
                        Tensor::attention(&q, &q, &q, true, 1.0 / (hd as f32).sqrt(), 0.0)?
                            .sum_all()
                    })?;
                    let mut grads = Gradients::new();
                    tape.backward(&loss, &mut grads)
                })?;
                run.work.attention_flops / run.rest(overhead, Some(&bandwidth))
            }
            None => matmul.f32,
        };
        let (collective_overhead_s, collective_elements_per_s) = match shapes.collectives {
            Some((world, elements)) if world > 1 => measure_collectives(world, elements),
            _ => (0.0, 0.0),
        };
        Ok(SpeedModel {
            matmul_flops_per_s: matmul,
            attention_flops_per_s: attention,
            elementwise_bytes_per_s: bandwidth,
            kernel_overhead_s: overhead,
            collective_elements_per_s,
            collective_overhead_s,
            optimizer_params_per_s: measure_updates(),
            host_copy_bytes_per_s: measure_host_copy(4 * elements),
        })
    }

    /// [`SpeedModel::step_time`] plus the optimizer step `kind` over `params` parameters (a
    /// rank's shard under ZeRO).
    pub fn step_time_with_update(
        &self,
        work: &Work,
        tokens: f64,
        kind: UpdateKind,
        params: f64,
    ) -> StepTime {
        let mut t = self.step_time(work, tokens);
        t.optimizer_s = params / self.optimizer_params_per_s.of(kind);
        t.step_s += t.optimizer_s;
        t.tokens_per_s = tokens / t.step_s;
        t.mfu = t.model_flops / t.step_s / self.matmul_flops_per_s.f32;
        t
    }

    /// Time of a step doing `work` on `tokens` tokens.
    pub fn step_time(&self, work: &Work, tokens: f64) -> StepTime {
        let compute_s = work.matmul_flops.over(&self.matmul_flops_per_s.per_width())
            + work.attention_flops / self.attention_flops_per_s;
        let memory_bound_s = work
            .elementwise_bytes
            .over(&self.elementwise_bytes_per_s.per_width());
        let kernel_overhead_s = work.kernels as f64 * self.kernel_overhead_s;
        let communication_s = work.collectives as f64 * self.collective_overhead_s
            + if self.collective_elements_per_s > 0.0 {
                work.collective_elements / self.collective_elements_per_s
            } else {
                0.0
            };
        // The engine's host copies are synchronous (no copy engine to overlap with on a CPU).
        let offload_s = if self.host_copy_bytes_per_s > 0.0 {
            work.host_transfer_bytes / self.host_copy_bytes_per_s
        } else {
            0.0
        };
        let step_s = compute_s + memory_bound_s + kernel_overhead_s + communication_s + offload_s;
        let model_flops = work.flops() - work.recompute_flops;
        StepTime {
            step_s,
            tokens_per_s: tokens / step_s,
            model_flops,
            recompute_flops: work.recompute_flops,
            compute_s,
            memory_bound_s,
            kernel_overhead_s,
            optimizer_s: 0.0,
            exposed_communication_s: communication_s,
            offload_s,
            communication_bytes_per_device: 4.0 * work.collective_elements,
            mfu: model_flops / step_s / self.matmul_flops_per_s.f32,
        }
    }
}

/// A collective's fixed cost and the ring elements per second a rank sends, on an in-process
/// group of `world` ranks moving blocks of `elements`.
fn measure_collectives(world: usize, elements: usize) -> (f64, f64) {
    let elements = elements.div_ceil(world).max(1) * world;
    // One element: the fixed cost (each run also broadcasts whether to go on: two collectives).
    let latency = time_on_group(world, &|c| c.all_reduce_sum(&mut [1.0])) / 2.0;
    let data = vec![0.5f32; elements];
    let blocks = time_on_group(world, &|c| {
        let mut shard = vec![0.0f32; elements / world];
        let mut whole = vec![0.0f32; elements];
        c.reduce_scatter_sum(&data, &mut shard)?;
        c.all_gather(&shard, &mut whole)?;
        c.all_reduce_sum(&mut whole)
    });
    let sent = Collective::ReduceScatter.ring_elements(elements as u64, world)
        + Collective::AllGather.ring_elements((elements / world) as u64, world)
        + Collective::AllReduce.ring_elements(elements as u64, world);
    // Three collectives and the broadcast per run.
    let moving = (blocks - 4.0 * latency).max(blocks * 0.05);
    (latency, sent / moving)
}

/// Seconds per run of `f` on every rank of an in-process group of `world`: the best of three
/// batches of at least [`MEASURE_FOR`], the slowest rank's.
fn time_on_group(
    world: usize,
    f: &(dyn Fn(&mut dyn Communicator) -> std::result::Result<(), CommError> + Sync),
) -> f64 {
    ThreadGroup::run(world, Duration::from_secs(60), |mut rank| {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let started = Instant::now();
            let mut runs = 0u32;
            // Every rank runs as often as rank 0 says.
            loop {
                f(&mut rank)?;
                runs += 1;
                let go_on = runs < 2 || started.elapsed() < MEASURE_FOR;
                let mut vote = [f32::from(u8::from(go_on))];
                rank.broadcast(&mut vote, 0)?;
                if vote[0] == 0.0 {
                    break;
                }
            }
            best = best.min(started.elapsed().as_secs_f64() / f64::from(runs));
        }
        Ok::<f64, CommError>(best)
    })
    .into_iter()
    .filter_map(|r| r.ok().and_then(std::result::Result::ok))
    .fold(0.0f64, f64::max)
}

/// One calibration: the workload's counted work and its best measured time.
struct Measured {
    work: Work,
    seconds: f64,
}

impl Measured {
    /// Seconds left for the work's main kind once the overhead of its kernels and (when the
    /// bandwidths are known) its element-wise bytes are taken out.
    fn rest(&self, overhead: f64, bandwidth: Option<&Rates>) -> f64 {
        let bytes = bandwidth.map_or(0.0, |b| self.work.elementwise_bytes.over(&b.per_width()));
        let other = self.work.kernels as f64 * overhead + bytes;
        (self.seconds - other).max(self.seconds * 0.05)
    }
}

fn filled(device: &Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
    Tensor::full(device, shape, 0.5, dtype, Category::Input, None)
}

/// Counts `f`'s work on a shape-only device, then times it on a CPU device (inputs included:
/// they are built by `f` and are part of the work too).
fn calibrate(f: impl Fn(&Device) -> Result<()>) -> Result<Measured> {
    let capacity = 8u64 << 30;
    let shape_only = Device::shape_only(capacity, AllocatorConfig::default());
    let (counted, work) = count_work(|| f(&shape_only));
    counted?;
    let cpu = Device::cpu(capacity, AllocatorConfig::default());
    f(&cpu)?; // warm-up: segments reserved, pages touched
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = Instant::now();
        let mut runs = 0u32;
        while runs < 2 || started.elapsed() < MEASURE_FOR {
            f(&cpu)?;
            runs += 1;
        }
        best = best.min(started.elapsed().as_secs_f64() / f64::from(runs));
    }
    Ok(Measured {
        work,
        seconds: best,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_nn::optim::StateDtype;

    #[test]
    fn step_time_adds_the_parts_at_their_rates() {
        let rates = |f32, bf16, f16| Rates { f32, bf16, f16 };
        let speed = SpeedModel {
            matmul_flops_per_s: rates(1e9, 5e8, 2.5e8),
            attention_flops_per_s: 2e8,
            elementwise_bytes_per_s: rates(1e9, 2.5e8, 1e8),
            kernel_overhead_s: 1e-6,
            collective_elements_per_s: 1e6,
            collective_overhead_s: 1e-3,
            optimizer_params_per_s: UpdateRates {
                f32: 1e8,
                bf16: 2e8,
                int8: 5e7,
                adafactor: 2.5e7,
            },
            host_copy_bytes_per_s: 1e9,
        };
        let width = |f32, bf16, f16| PerWidth { f32, bf16, f16 };
        let work = Work {
            matmul_flops: width(2e9, 1e9, 0.0),
            attention_flops: 2e8,
            elementwise_bytes: width(5e8, 5e7, 1e7),
            kernels: 1000,
            recompute_flops: 1e9,
            collectives: 10,
            collective_elements: 2e5,
            host_transfer_bytes: 1e8,
        };
        let t = speed.step_time(&work, 1000.0);
        // 2 + 2 + 1 s of compute; 0.5 + 0.2 + 0.1 s memory bound; 1 ms of kernel overhead;
        // 10 ms of collectives' overhead and 0.2 s sending 2e5 elements at 1e6 per second;
        // 0.1 s copying 1e8 bytes to and from the host at 1e9 per second.
        assert!((t.compute_s - 5.0).abs() < 1e-12);
        assert!((t.memory_bound_s - 0.8).abs() < 1e-12);
        assert!((t.exposed_communication_s - 0.21).abs() < 1e-12);
        assert!((t.offload_s - 0.1).abs() < 1e-12);
        assert_eq!(t.communication_bytes_per_device, 8e5);
        assert!((t.step_s - 6.111).abs() < 1e-12);
        assert_eq!(t.model_flops, 2.2e9);
        assert!((t.tokens_per_s - 1000.0 / 6.111).abs() < 1e-9);
        // The update of 1e7 parameters: 0.1 s with f32 states, 0.2 s with 8-bit ones.
        let u = speed.step_time_with_update(&work, 1000.0, UpdateKind::Adam(StateDtype::Int8), 1e7);
        assert!((u.optimizer_s - 0.2).abs() < 1e-12 && (u.step_s - 6.311).abs() < 1e-12);
        assert!((u.tokens_per_s - 1000.0 / 6.311).abs() < 1e-9);
        let f = speed.step_time_with_update(&work, 1000.0, UpdateKind::Adam(StateDtype::F32), 1e7);
        assert!((f.optimizer_s - 0.1).abs() < 1e-12);
        // Adafactor at its own rate: 0.4 s.
        let a = speed.step_time_with_update(&work, 1000.0, UpdateKind::Adafactor, 1e7);
        assert!((a.optimizer_s - 0.4).abs() < 1e-12);
    }
}
