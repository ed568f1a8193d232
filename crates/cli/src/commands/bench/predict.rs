//! `headroom bench predict`: its argument and the tables of the experiment
//! (`headroom_train::bench::predict`, which says what it measures).
//!
//! Not for: measuring (the train crate's `bench::predict`).

use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_memory::size::format_bytes;
use headroom_train::bench::predict::{FIGURES, PredictBench, measure};
use headroom_train::predict::error::relative_error;

#[derive(Debug, Args)]
pub struct PredictBenchArgs {
    /// One JSON object on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: PredictBenchArgs) -> anyhow::Result<()> {
    let bench = measure(&mut |i, total| {
        if !args.json {
            eprint!("\rconfiguration {i}/{total}");
        }
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        eprintln!();
        print_tables(&bench);
    }
    Ok(())
}

fn percent(e: f64) -> String {
    format!("{:+.1} %", 100.0 * e)
}

fn print_tables(bench: &PredictBench) {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "configuration",
        "allocated",
        "dry run",
        "analytical",
        "activation",
        "dry run",
        "analytical",
        "reserved",
        "dry run",
        "analytical",
    ]);
    for r in &bench.rows {
        let mut row = vec![r.label.clone()];
        for (_, get) in FIGURES {
            let m = get(&r.measured);
            row.push(format_bytes(m));
            row.push(percent(relative_error(get(&r.dry_run), m)));
            row.push(percent(relative_error(get(&r.analytical), m)));
        }
        t.add_row(row);
    }
    println!(
        "Measured peaks and the predictions' relative errors (predicted − measured) / measured:"
    );
    println!("{t}");
    let mut s = Table::new();
    s.load_preset(UTF8_FULL_CONDENSED);
    s.set_header([
        "figure",
        "predictor",
        "max |error|",
        "mean |error|",
        "configurations",
    ]);
    for e in &bench.summary {
        s.add_row([
            e.figure.to_string(),
            e.predictor.to_string(),
            format!("{:.2} %", 100.0 * e.max_abs),
            format!("{:.2} %", 100.0 * e.mean_abs),
            e.configurations.to_string(),
        ]);
    }
    println!("{s}");
    println!(
        "The analytical reserved peak includes the planner's 10 % fragmentation reserve; the dry run's is the allocator's own."
    );
}
