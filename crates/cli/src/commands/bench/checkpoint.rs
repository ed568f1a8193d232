//! `headroom bench checkpoint`: the Chen et al. (2016) reproduction on the deep residual MLP —
//! peak activation bytes (exact, from dry runs on the real allocator) and step time (measured)
//! against depth for `none`, `all`, `sqrt` and `budget` (at √n's peak), the log-log slopes of
//! memory against depth (≈ 1 for none, ≈ 0.5 for √n) and the time overhead of √n — and on the
//! GPT the step time and activation peak of each policy, including selective recomputation.
//!
//! Not for: the planning algorithms (the train crate's `recompute`).

use crate::report::plot::write_loglog_svg;
use clap::Args;
use clap::builder::TypedValueParser;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_memory::size::format_bytes;
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_nn::Recompute;
use headroom_nn::models::gpt::Attention;
use headroom_nn::models::{ModelSpec, ResMlpConfig, build_model, preset};
use headroom_plan::strategy::{Checkpoint, Loss, largest_fitting};
use headroom_tensor::{DType, Gradients, Tape, Tensor};
use headroom_train::recompute::policy::recompute_for;
use headroom_train::recompute::{Plan, dry_run};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct CheckpointBenchArgs {
    /// Depths of the residual MLP (blocks).
    #[arg(long, value_delimiter = ',', default_values_t = [16usize, 32, 64, 128, 256, 512, 1024])]
    pub depths: Vec<usize>,
    /// Width of the residual MLP (its hidden layer is 4 × width).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub width: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub micro_batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub seq_len: usize,
    /// Measure step times only up to this depth (memory is measured at every depth).
    #[arg(long, default_value_t = 256)]
    pub max_timed_depth: usize,
    /// Timed repetitions per point (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..).map(|v| v as usize))]
    pub repeats: usize,
    /// One JSON object on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Device budget for the longest-sequence experiment on the GPT.
    #[arg(long, default_value = "256MiB")]
    pub gpt_budget: headroom_memory::size::ByteSize,
    /// Where to draw memory against depth (SVG).
    #[arg(long, default_value = "headroom-checkpoint.svg")]
    pub plot: PathBuf,
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

const POLICIES: [&str; 4] = ["none", "all", "sqrt", "budget"];

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
) -> anyhow::Result<Recompute> {
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
) -> anyhow::Result<f64> {
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
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn slope(points: &[(f64, f64)]) -> f64 {
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

pub fn run(args: CheckpointBenchArgs) -> anyhow::Result<()> {
    let mut distinct = args.depths.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 2 || distinct[0] == 0 {
        anyhow::bail!(
            "--depths needs at least two different depths of one block or more (e.g. 16,64,256) to fit the memory-against-depth slopes"
        );
    }
    let mut resmlp_points = Vec::new();
    for &depth in &args.depths {
        let spec = resmlp(depth, args.width);
        let sqrt = Recompute {
            segments: Plan::sqrt(depth).segments,
            selective: false,
            ..Default::default()
        };
        let sqrt_peak =
            dry_run::activation_peak(&spec, DType::F32, args.micro_batch, args.seq_len, &sqrt)?;
        for policy in POLICIES {
            let recompute = recompute_of(policy, &spec, args.micro_batch, args.seq_len, sqrt_peak)?;
            let peak = dry_run::activation_peak(
                &spec,
                DType::F32,
                args.micro_batch,
                args.seq_len,
                &recompute,
            )?;
            let step_time_s = if depth <= args.max_timed_depth {
                Some(step_time(
                    &spec,
                    args.micro_batch,
                    args.seq_len,
                    &recompute,
                    args.repeats,
                )?)
            } else {
                None
            };
            let recomputed_blocks = recompute.segments.iter().map(|s| s.len()).sum();
            if !args.json {
                eprintln!(
                    "resmlp depth {depth:>5} {policy:<7} peak activations {:>12}",
                    format_bytes(peak)
                );
            }
            resmlp_points.push(Point {
                depth,
                policy: policy.into(),
                recomputed_blocks,
                peak_activation_bytes: peak,
                step_time_s,
            });
        }
    }
    let slopes: Vec<(String, f64)> = POLICIES
        .iter()
        .map(|p| {
            let pts: Vec<(f64, f64)> = resmlp_points
                .iter()
                .filter(|q| q.policy == *p)
                .map(|q| (q.depth as f64, q.peak_activation_bytes as f64))
                .collect();
            (p.to_string(), slope(&pts))
        })
        .collect();
    let time_of = |depth: usize, policy: &str| {
        resmlp_points
            .iter()
            .find(|p| p.depth == depth && p.policy == policy)
            .and_then(|p| p.step_time_s)
    };
    let sqrt_time_overhead: Vec<(usize, f64)> = args
        .depths
        .iter()
        .filter_map(|&d| Some((d, time_of(d, "sqrt")? / time_of(d, "none")? - 1.0)))
        .collect();

    // GPT: each policy at the default shape, micro-batch 16 × 128 tokens.
    let gpt = preset("gpt-small").expect("preset exists");
    let mut gpt_points = Vec::new();
    for policy in ["none", "all", "every:2", "sqrt", "selective"] {
        let recompute = recompute_of(policy, &gpt, 16, 128, 0)?;
        let peak = dry_run::activation_peak(&gpt, DType::F32, 16, 128, &recompute)?;
        let t = step_time(&gpt, 16, 128, &recompute, args.repeats)?;
        let recomputed_blocks = recompute.segments.iter().map(|s| s.len()).sum();
        gpt_points.push(Point {
            depth: gpt.depth(),
            policy: policy.into(),
            recomputed_blocks,
            peak_activation_bytes: peak,
            step_time_s: Some(t),
        });
    }

    let longest_sequence = longest_sequences(args.gpt_budget.0)?;
    let bench = CheckpointBench {
        resmlp: resmlp_points,
        slopes,
        sqrt_time_overhead,
        gpt: gpt_points,
        longest_sequence,
        gpt_budget_bytes: args.gpt_budget.0,
    };
    let series: Vec<(String, Vec<(f64, f64)>)> = POLICIES
        .iter()
        .map(|p| {
            let pts = bench
                .resmlp
                .iter()
                .filter(|q| q.policy == *p)
                .map(|q| {
                    (
                        q.depth as f64,
                        q.peak_activation_bytes as f64 / (1u64 << 20) as f64,
                    )
                })
                .collect();
            (p.to_string(), pts)
        })
        .collect();
    write_loglog_svg(
        &series,
        "Residual MLP: peak activation memory against depth",
        "blocks",
        "MiB",
        &args.plot,
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
        return Ok(());
    }
    print_tables(&bench);
    println!("Memory against depth (log-log): {}", args.plot.display());
    Ok(())
}

/// Bytes of one training step of `spec` at `seq_len`: the dry run's allocated peak (parameters,
/// gradients, activations, temporaries) plus AdamW's two fp32 states per parameter.
fn step_bytes(spec: &ModelSpec, seq_len: usize, recompute: &Recompute) -> anyhow::Result<u64> {
    let (_, allocated) = dry_run::peaks(spec, DType::F32, 4, seq_len, recompute)?;
    Ok(allocated + 8 * spec.num_params() as u64)
}

/// For naive and memory-efficient attention, without and with checkpointing every block: the
/// longest sequence (multiple of 64, up to 8192) whose step fits `budget`.
fn longest_sequences(budget: u64) -> anyhow::Result<Vec<(String, String, usize)>> {
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
            let fits = |&t: &usize| -> anyhow::Result<(usize, bool)> {
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

fn print_tables(b: &CheckpointBench) {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "depth",
        "policy",
        "recomputed blocks",
        "peak activations",
        "step time",
    ]);
    for p in &b.resmlp {
        t.add_row(vec![
            p.depth.to_string(),
            p.policy.clone(),
            p.recomputed_blocks.to_string(),
            format_bytes(p.peak_activation_bytes),
            p.step_time_s
                .map_or("-".into(), |s| format!("{:.1} ms", s * 1e3)),
        ]);
    }
    println!("Residual MLP (Chen et al. 2016 reproduction):\n{t}");
    for (p, s) in &b.slopes {
        println!("  slope of ln(peak) against ln(depth), {p}: {s:.3}");
    }
    for (d, o) in &b.sqrt_time_overhead {
        println!("  √n step-time overhead at depth {d}: {:+.1} %", o * 100.0);
    }
    let mut g = Table::new();
    g.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "policy",
        "recomputed blocks",
        "peak activations",
        "step time",
        "vs none",
    ]);
    let base = b.gpt.first().and_then(|p| p.step_time_s).unwrap_or(1.0);
    let base_mem = b.gpt.first().map_or(1, |p| p.peak_activation_bytes);
    for p in &b.gpt {
        let t = p.step_time_s.unwrap_or(0.0);
        g.add_row(vec![
            p.policy.clone(),
            p.recomputed_blocks.to_string(),
            format!(
                "{} ({:.0} %)",
                format_bytes(p.peak_activation_bytes),
                100.0 * p.peak_activation_bytes as f64 / base_mem as f64
            ),
            format!("{:.1} ms", t * 1e3),
            format!("{:+.1} %", (t / base - 1.0) * 100.0),
        ]);
    }
    println!("GPT gpt-small, micro-batch 16 × 128 tokens, fp32:\n{g}");
    let mut l = Table::new();
    l.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "attention",
        "checkpoint",
        "longest sequence",
    ]);
    for (a, p, t) in &b.longest_sequence {
        l.add_row(vec![
            a.clone(),
            p.clone(),
            if *t == 0 {
                "none fits".into()
            } else {
                format!("{t} tokens")
            },
        ]);
    }
    println!(
        "GPT gpt-small at micro-batch 4 in a {} budget (AdamW, fp32):\n{l}",
        format_bytes(b.gpt_budget_bytes)
    );
}
