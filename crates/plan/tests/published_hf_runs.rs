//! The planner held to a second table of published runs (`tests/data/published/hf_runs.toml`):
//! Hugging Face Trainer, PEFT, TRL, Axolotl, Unsloth's Hugging Face baselines and LLaMA-Factory
//! runs, collected from sources the speed model was never fitted to. Each row is a measured peak,
//! a setting that ran out of memory, or a setting that fit. The planner must give every row its
//! verdict (fits or does not), predict the measured peaks within 10 % mean and 20 % worst with no
//! systematic under-prediction (signed mean within ±5 %), and the published throughputs within
//! 20 % mean.
//!
//! `cargo test -p headroom-plan --test published_hf_runs -- --nocapture` prints the table.

mod support;

use support::published::{Row, error, gib, mean, print_table, rows, worst};

const TABLE: &str = "hf_runs.toml";

/// The goals the planner is held to on this table (docs/planner.md, "Held to reality").
const MEMORY_MEAN: f64 = 0.10;
const MEMORY_WORST: f64 = 0.20;
const MEMORY_SIGNED: f64 = 0.05;
const SPEED_MEAN: f64 = 0.20;

fn verdict(r: &Row) -> String {
    format!(
        "{}: published {}, predicted {} GiB on a {} GiB GPU ({} usable)",
        r.run.id,
        if r.run.oom { "out of memory" } else { "fits" },
        gib(r.plan.memory.per_device_peak_bytes as f64),
        gib(r.problem.hardware.gpu.memory_bytes as f64),
        gib(r.problem.usable_device_bytes() as f64)
    )
}

#[test]
fn the_table_spans_the_frameworks_people_fine_tune_with() {
    let rows = rows(TABLE);
    let mut sources: Vec<&str> = rows.iter().map(|r| r.run.source.as_str()).collect();
    sources.sort();
    sources.dedup();
    assert!(rows.len() >= 15, "{} rows", rows.len());
    assert!(sources.len() >= 6, "{sources:?}");
    assert!(rows.iter().any(|r| r.run.oom), "no out-of-memory row");
    assert!(
        rows.iter().filter(|r| r.memory.is_some()).count() >= 8,
        "too few measured peaks"
    );
    for r in &rows {
        assert!(
            !(r.run.oom && r.memory.is_some()),
            "{}: an out-of-memory row has no peak to compare",
            r.run.id
        );
        assert!(
            !r.run.fitted,
            "{}: nothing is fitted to this table",
            r.run.id
        );
    }
}

#[test]
fn every_fit_verdict_is_the_published_one() {
    let rows = rows(TABLE);
    print_table(&rows);
    let wrong: Vec<String> = rows
        .iter()
        .filter(|r| r.plan.fits == r.run.oom)
        .map(verdict)
        .collect();
    assert!(wrong.is_empty(), "wrong verdicts:\n{}", wrong.join("\n"));
}

#[test]
fn measured_peaks_are_predicted_within_the_goals() {
    let rows = rows(TABLE);
    let signed: Vec<f64> = rows.iter().filter_map(|r| r.memory).map(error).collect();
    let abs: Vec<f64> = signed.iter().map(|e| e.abs()).collect();
    println!(
        "memory: {} rows, mean |error| {:.1} %, worst {:.1} %, signed mean {:+.1} %",
        abs.len(),
        100.0 * mean(&abs),
        100.0 * worst(&abs),
        100.0 * mean(&signed)
    );
    assert!(mean(&abs) <= MEMORY_MEAN, "{signed:?}");
    assert!(worst(&abs) <= MEMORY_WORST, "{signed:?}");
    assert!(mean(&signed).abs() <= MEMORY_SIGNED, "{signed:?}");
}

#[test]
fn published_throughputs_are_predicted_within_the_goal() {
    let rows = rows(TABLE);
    let speed: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.speed)
        .map(|s| error(s).abs())
        .collect();
    println!(
        "throughput: {} rows, mean |error| {:.1} %, worst {:.1} %",
        speed.len(),
        100.0 * mean(&speed),
        100.0 * worst(&speed)
    );
    assert!(!speed.is_empty(), "no published throughput in the table");
    assert!(mean(&speed) <= SPEED_MEAN, "{speed:?}");
}
