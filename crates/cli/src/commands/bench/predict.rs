//! `headroom bench predict`: predicted against measured over the 32-configuration matrix of
//! headroom runs — each configuration trained for three steps, dry-run, and costed by the
//! planner's analytical model — with the relative error of both predictions for the allocated
//! peak, the activations' own peak and the reserved peak (the analytical model's with its
//! fragmentation reserve), and their worst and mean absolute errors.
//!
//! Not for: asserting anything (the prediction test bounds the dry run's error).

use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_memory::size::format_bytes;
use headroom_memory::{Category, MemoryPeaks};
use headroom_train::data::Corpus;
use headroom_train::predict::error::{PredictionError, evaluate, matrix, relative_error};
use serde::Serialize;

#[derive(Debug, Args)]
pub struct PredictBenchArgs {
    /// One JSON object on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Worst and mean absolute relative error of one prediction of one figure.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorSummary {
    pub figure: &'static str,
    pub predictor: &'static str,
    pub max_abs: f64,
    pub mean_abs: f64,
    pub configurations: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct PredictBench {
    pub rows: Vec<PredictionError>,
    pub summary: Vec<ErrorSummary>,
}

type Figure = fn(&MemoryPeaks) -> u64;

const FIGURES: [(&str, Figure); 3] = [
    ("allocated peak", |p| p.peak_allocated_bytes),
    ("activation peak", |p| {
        p.peak_bytes_by_category[Category::Activation]
    }),
    ("reserved peak", |p| p.peak_reserved_bytes),
];

pub fn run(args: PredictBenchArgs) -> anyhow::Result<()> {
    let corpus = Corpus::bundled();
    let configs = matrix();
    let total = configs.len();
    let mut rows = Vec::new();
    for (i, c) in configs.into_iter().enumerate() {
        if !args.json {
            eprint!("\rconfiguration {}/{total}", i + 1);
        }
        rows.push(evaluate(c, &corpus)?);
    }
    if !args.json {
        eprintln!();
    }
    let mut summary = Vec::new();
    for (figure, get) in FIGURES {
        for predictor in ["dry run", "analytical"] {
            let errors: Vec<f64> = rows
                .iter()
                .map(|r| {
                    let p = if predictor == "dry run" {
                        &r.dry_run
                    } else {
                        &r.analytical
                    };
                    relative_error(get(p), get(&r.measured)).abs()
                })
                .collect();
            if errors.is_empty() {
                continue;
            }
            summary.push(ErrorSummary {
                figure,
                predictor,
                max_abs: errors.iter().cloned().fold(0.0, f64::max),
                mean_abs: errors.iter().sum::<f64>() / errors.len() as f64,
                configurations: errors.len(),
            });
        }
    }
    let bench = PredictBench { rows, summary };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
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
