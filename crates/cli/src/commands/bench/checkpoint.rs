//! `headroom bench checkpoint`: its arguments, and the tables and the memory-against-depth
//! picture of the experiment (`headroom_train::bench::checkpoint`, which says what it measures).
//!
//! Not for: measuring (the train crate's `bench::checkpoint`).

use crate::report::plot::write_loglog_svg;
use clap::Args;
use clap::builder::TypedValueParser;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_memory::size::format_bytes;
use headroom_train::bench::checkpoint::{
    CheckpointBench, CheckpointOptions, GPT_SHAPE, RESMLP_POLICIES, measure,
};
use std::path::PathBuf;

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

pub fn run(args: CheckpointBenchArgs) -> anyhow::Result<()> {
    let options = CheckpointOptions {
        depths: args.depths,
        width: args.width,
        micro_batch: args.micro_batch,
        seq_len: args.seq_len,
        max_timed_depth: args.max_timed_depth,
        repeats: args.repeats,
        gpt_budget: args.gpt_budget.0,
    };
    let bench = measure(&options, &mut |p| {
        if !args.json {
            eprintln!(
                "resmlp depth {:>5} {:<7} peak activations {:>12}",
                p.depth,
                p.policy,
                format_bytes(p.peak_activation_bytes)
            );
        }
    })?;
    let series: Vec<(String, Vec<(f64, f64)>)> = RESMLP_POLICIES
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
    let (micro_batch, tokens) = GPT_SHAPE;
    println!("GPT gpt-small, micro-batch {micro_batch} × {tokens} tokens, fp32:\n{g}");
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
