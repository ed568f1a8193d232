//! `headroom bench speed`: its arguments and the table of the experiment
//! (`headroom_train::bench::speed`, which says what it measures).
//!
//! Not for: measuring (the train crate's `bench::speed`).

use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_train::bench::speed::{SpeedBench, SpeedOptions, measure};

#[derive(Debug, Args)]
pub struct SpeedBenchArgs {
    /// Model preset or model TOML.
    #[arg(long, default_value = "gpt-small")]
    pub model: String,
    /// Sequences per optimizer step (the whole batch; the quarter-batch split accumulates 4).
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Timed steps per strategy, after one warm-up step.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    /// One JSON object on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: SpeedBenchArgs) -> anyhow::Result<()> {
    let options = SpeedOptions {
        model: args.model,
        batch: args.batch,
        steps: args.steps,
    };
    let bench = measure(&options, &mut |i, total| {
        if !args.json {
            eprint!("\rstrategy {i}/{total}");
        }
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        eprintln!();
        print_table(&bench);
    }
    Ok(())
}

fn print_table(b: &SpeedBench) {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "strategy",
        "predicted tokens/s",
        "measured tokens/s",
        "error",
    ]);
    for r in &b.rows {
        t.add_row([
            r.strategy.clone(),
            format!("{:.0}", r.predicted_tokens_per_s),
            format!("{:.0}", r.measured_tokens_per_s),
            format!("{:+.1} %", 100.0 * r.error),
        ]);
    }
    println!("{}: the speed model against measured steps", b.model);
    println!("{t}");
    println!(
        "Mean |error| {:.1} %, worst {:.1} %; Spearman rank correlation {:.2}; the predicted fastest ranks {} of {} measured.",
        100.0 * b.mean_abs_error,
        100.0 * b.max_abs_error,
        b.rank_correlation,
        b.predicted_best_measured_rank,
        b.rows.len()
    );
}
