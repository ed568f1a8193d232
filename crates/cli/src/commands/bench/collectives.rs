//! `headroom bench collectives`: its arguments and the table of the experiment
//! (`headroom_train::bench::collectives`, which says what it measures and how the bandwidths are
//! counted). Under `mpirun` (the `mpi` build) rank 0 prints and the other ranks print nothing.
//!
//! Not for: measuring (the train crate's `bench::collectives`).

use anyhow::Result;
use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_train::bench::collectives::{CollectivesOptions, CollectivesRun, Row, measure};

#[derive(Debug, Args)]
pub struct CollectivesBenchArgs {
    /// Thread-group sizes to measure (ignored under mpirun, where the job's size is the group).
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4])]
    pub ranks: Vec<usize>,
    /// Elements (f32) of each collective's data: an all-reduce's buffer, a reduce-scatter's
    /// input, an all-gather's output.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize << 14, 1 << 18, 1 << 22])]
    pub elements: Vec<usize>,
    /// Timed calls per collective and size (after 2 warm-up calls); the median is reported.
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CollectivesBenchArgs) -> Result<()> {
    let options = CollectivesOptions {
        ranks: args.ranks,
        elements: args.elements,
        reps: args.reps,
    };
    match measure(&options)? {
        CollectivesRun::Rows(rows) => print(args.json, &rows),
        CollectivesRun::OtherRank => Ok(()),
    }
}

fn print(json: bool, rows: &[Row]) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "rows": rows }))?
        );
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "transport",
        "ranks",
        "collective",
        "elements",
        "median time",
        "algorithm GB/s",
        "bus GB/s",
    ]);
    for r in rows {
        table.add_row(vec![
            r.transport.clone(),
            r.ranks.to_string(),
            r.collective.to_string(),
            r.elements.to_string(),
            format!("{:.1} µs", r.seconds * 1e6),
            format!("{:.2}", r.algorithm_gb_per_s),
            format!("{:.2}", r.bus_gb_per_s),
        ]);
    }
    println!("{table}");
    Ok(())
}
