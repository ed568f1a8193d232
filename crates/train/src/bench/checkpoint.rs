//! Activation checkpointing measured: the Chen et al. (2016) reproduction on the deep residual
//! MLP — peak activation bytes (exact, from dry runs on the real allocator) and step time
//! (measured) against depth for `none`, `all`, `sqrt` and `budget` (at √n's peak), the log-log
//! slopes of memory against depth (≈ 1 for none, ≈ 0.5 for √n) and the time overhead of √n — and
//! on the GPT the step time and activation peak of each policy, including selective
//! recomputation, and the longest sequence whose step fits a device budget.
//!
//! Not for: the planning algorithms (`crate::recompute`).

use super::{BenchError, median};
use crate::recompute::policy::recompute_for;
use crate::recompute::{Plan, dry_run};
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::Recompute;
use headroom_nn::models::gpt::Attention;
use headroom_nn::models::{ModelSpec, ResMlpConfig, build_model, preset};
use headroom_strategy::{Checkpoint, Loss, largest_fitting};
use headroom_tensor::{DType, Gradients, Tape, Tensor};
use serde::Serialize;
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct CheckpointOptions {
    /// Depths of the residual MLP (blocks).
    pub depths: Vec<usize>,
    /// Width of the residual MLP (its hidden layer is 4 × width).
    pub width: usize,
    pub micro_batch: usize,
    pub seq_len: usize,
    /// Step times are measured up to this depth (memory at every depth).
    pub max_timed_depth: usize,
    /// Timed repetitions per point (the median is kept).
    pub repeats: usize,
    /// Device budget of the longest-sequence experiment on the GPT, in bytes.
    pub gpt_budget: u64,
}

/// One (depth, policy) point.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub depth: usize,
    pub policy: String,
    pub recomputed_blocks: usize,
    pub peak_activation_bytes: u64,
    pub step_time_s: Option<f64>,
}

/// Everything the benchmark measures.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointBench {
    pub resmlp: Vec<Point>,
    /// Least-squares slope of ln(peak activation bytes) against ln(depth), per policy.
    pub slopes: Vec<(String, f64)>,
    /// step time with √n / without recomputation − 1, per timed depth.
    pub sqrt_time_overhead: Vec<(usize, f64)>,
    pub gpt: Vec<Point>,
    /// Longest sequence (a multiple of 64) whose step fits `gpt_budget` at micro-batch 4:
    /// (attention, checkpoint policy, tokens).
    pub longest_sequence: Vec<(String, String, usize)>,
    pub gpt_budget_bytes: u64,
}

/// The residual MLP's policies, in the order of its points.
pub const RESMLP_POLICIES: [&str; 4] = ["none", "all", "sqrt", "budget"];

/// The GPT's policies, in the order of its points (the first is the reference).
pub const GPT_POLICIES: [&str; 5] = ["none", "all", "every:2", "sqrt", "selective"];

/// The GPT's shape in the per-policy experiment: (micro-batch, tokens).
pub const GPT_SHAPE: (usize, usize) = (16, 128);

fn resmlp(depth: usize, width: usize) -> ModelSpec {
    ModelSpec::Resmlp(ResMlpConfig {
        vocab: 256,
        width,
        hidden: 4 * width,
        depth,
        dropout: 0.0,
    })
}

fn recompute_of(
    policy: &str,
    spec: &ModelSpec,
    micro_batch: usize,
    seq_len: usize,
    sqrt_peak: u64,
) -> Result<Recompute, BenchError> {
    let p = match policy {
        "budget" => Checkpoint::Budget(sqrt_peak),
        other => other.parse()?,
    };
    Ok(recompute_for(p, Loss::Plain, spec, DType::F32, micro_batch, seq_len)?.0)
}

/// Median seconds of one forward + backward under `recompute` on a CPU device.
fn step_time(
    spec: &ModelSpec,
    micro_batch: usize,
    seq_len: usize,
    recompute: &Recompute,
    repeats: usize,
) -> Result<f64, BenchError> {
    let device = Device::cpu(64 << 30, AllocatorConfig::default());
    let model = build_model("bench", spec, &device, DType::F32, 1)?;
    let mut grads = Gradients::new();
    for b in model.blocks() {
        b.bind_grads(&mut grads)?;
    }
    let ids: Vec<i64> = (0..micro_batch * seq_len)
        .map(|i| (i * 31 % 256) as i64)
        .collect();
    let x = Tensor::from_i64(
        &device,
        &[micro_batch, seq_len],
        &ids,
        DType::I64,
        Category::Input,
        None,
    )?;
    let mut times = Vec::new();
    for r in 0..=repeats {
        let t0 = Instant::now();
        let tape = Tape::new();
        let loss = tape.record(|| model.loss(&x, &x, recompute))?;
        tape.backward(&loss, &mut grads)?;
        if r > 0 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok(median(&mut times))
}

/// Least-squares slope of ln y against ln x over `points` (x, y).
pub fn log_log_slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x.ln(), b + y.ln()));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x.ln() - mx) * (y.ln() - my), b + (x.ln() - mx).powi(2))
    });
    num / den
}

/// Runs the experiment; `on_point` sees each residual-MLP point as it is measured.
pub fn measure(
    options: &CheckpointOptions,
    on_point: &mut dyn FnMut(&Point),
) -> Result<CheckpointBench, BenchError> {
    let o = options;
    let mut distinct = o.depths.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 2 || distinct[0] == 0 {
        return Err(BenchError::TooFewDepths);
    }
    let mut resmlp_points = Vec::new();
    for &depth in &o.depths {
        let spec = resmlp(depth, o.width);
        let sqrt = Recompute {
            segments: Plan::sqrt(depth).segments,
            selective: false,
            ..Default::default()
        };
        let sqrt_peak =
            dry_run::activation_peak(&spec, DType::F32, o.micro_batch, o.seq_len, &sqrt)?;
        for policy in RESMLP_POLICIES {
            let recompute = recompute_of(policy, &spec, o.micro_batch, o.seq_len, sqrt_peak)?;
            let peak =
                dry_run::activation_peak(&spec, DType::F32, o.micro_batch, o.seq_len, &recompute)?;
            let step_time_s = if depth <= o.max_timed_depth {
                Some(step_time(
                    &spec,
                    o.micro_batch,
                    o.seq_len,
                    &recompute,
                    o.repeats,
                )?)
            } else {
                None
            };
            let point = Point {
                depth,
                policy: policy.into(),
                recomputed_blocks: recompute.segments.iter().map(|s| s.len()).sum(),
                peak_activation_bytes: peak,
                step_time_s,
            };
            on_point(&point);
            resmlp_points.push(point);
        }
    }
    let slopes: Vec<(String, f64)> = RESMLP_POLICIES
        .iter()
        .map(|p| {
            let pts: Vec<(f64, f64)> = resmlp_points
                .iter()
                .filter(|q| q.policy == *p)
                .map(|q| (q.depth as f64, q.peak_activation_bytes as f64))
                .collect();
            (p.to_string(), log_log_slope(&pts))
        })
        .collect();
    let time_of = |depth: usize, policy: &str| {
        resmlp_points
            .iter()
            .find(|p| p.depth == depth && p.policy == policy)
            .and_then(|p| p.step_time_s)
    };
    let sqrt_time_overhead: Vec<(usize, f64)> = o
        .depths
        .iter()
        .filter_map(|&d| Some((d, time_of(d, "sqrt")? / time_of(d, "none")? - 1.0)))
        .collect();

    let gpt = preset("gpt-small").expect("preset exists");
    let (micro_batch, seq_len) = GPT_SHAPE;
    let mut gpt_points = Vec::new();
    for policy in GPT_POLICIES {
        let recompute = recompute_of(policy, &gpt, micro_batch, seq_len, 0)?;
        let peak = dry_run::activation_peak(&gpt, DType::F32, micro_batch, seq_len, &recompute)?;
        let t = step_time(&gpt, micro_batch, seq_len, &recompute, o.repeats)?;
        gpt_points.push(Point {
            depth: gpt.depth(),
            policy: policy.into(),
            recomputed_blocks: recompute.segments.iter().map(|s| s.len()).sum(),
            peak_activation_bytes: peak,
            step_time_s: Some(t),
        });
    }

    Ok(CheckpointBench {
        resmlp: resmlp_points,
        slopes,
        sqrt_time_overhead,
        gpt: gpt_points,
        longest_sequence: longest_sequences(o.gpt_budget)?,
        gpt_budget_bytes: o.gpt_budget,
    })
}

/// Bytes of one training step of `spec` at `seq_len`: the dry run's allocated peak (parameters,
/// gradients, activations, temporaries) plus AdamW's two fp32 states per parameter.
fn step_bytes(spec: &ModelSpec, seq_len: usize, recompute: &Recompute) -> Result<u64, BenchError> {
    let (_, allocated) = dry_run::peaks(spec, DType::F32, 4, seq_len, recompute)?;
    Ok(allocated + 8 * spec.num_params() as u64)
}

/// For naive and memory-efficient attention, without and with checkpointing every block: the
/// longest sequence (multiple of 64, up to 8192) whose step fits `budget`.
fn longest_sequences(budget: u64) -> Result<Vec<(String, String, usize)>, BenchError> {
    let mut out = Vec::new();
    for attention in [Attention::Naive, Attention::MemoryEfficient] {
        for policy in ["none", "all"] {
            let spec_at = |t: usize| {
                let mut spec = preset("gpt-small").expect("preset exists").with_overrides(
                    None,
                    None,
                    None,
                    Some(t),
                );
                if let ModelSpec::Gpt(c) = &mut spec {
                    c.attention = attention;
                }
                spec
            };
            let fits = |&t: &usize| -> Result<(usize, bool), BenchError> {
                let spec = spec_at(t);
                let recompute = recompute_of(policy, &spec, 4, t, 0)?;
                Ok((t, step_bytes(&spec, t, &recompute)? <= budget))
            };
            // Multiples of 64 tokens, longest first.
            let lengths: Vec<usize> = (1..=8192 / 64).rev().map(|u| u * 64).collect();
            let (longest, _) = largest_fitting(&lengths, fits, |&(_, f)| f)?;
            let longest = longest.map_or(0, |(t, _)| t);
            out.push((attention.to_string(), policy.to_string(), longest));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_log_slope_recovers_the_exponent_of_a_power_law() {
        // y = 3 · x^k on any x: ln y = ln 3 + k ln x, a line of slope k.
        for k in [1.0, 0.5, 0.0, 2.0] {
            let pts: Vec<(f64, f64)> = [16.0, 64.0, 256.0, 1024.0]
                .iter()
                .map(|&x: &f64| (x, 3.0 * x.powf(k)))
                .collect();
            assert!((log_log_slope(&pts) - k).abs() < 1e-12, "k = {k}");
        }
        // Two points: the slope through them, ln(8/2) / ln(4/1) = 1.
        assert!((log_log_slope(&[(1.0, 2.0), (4.0, 8.0)]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn fewer_than_two_depths_or_a_zero_depth_is_refused_before_measuring() {
        let options = |depths: Vec<usize>| CheckpointOptions {
            depths,
            width: 1,
            micro_batch: 1,
            seq_len: 1,
            max_timed_depth: 0,
            repeats: 1,
            gpt_budget: 0,
        };
        for depths in [vec![16], vec![16, 16], vec![0, 16], vec![]] {
            let mut seen = 0;
            let r = measure(&options(depths.clone()), &mut |_| seen += 1);
            assert!(matches!(r, Err(BenchError::TooFewDepths)), "{depths:?}");
            assert_eq!(seen, 0, "{depths:?}: nothing measured");
        }
    }
}
