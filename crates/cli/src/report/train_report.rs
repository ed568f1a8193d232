//! The end-of-run text report of `headroom train`: the allocator's summary table, the bytes per
//! category at the peak and each category's own peak against the budget, and the run's losses
//! and throughput.
//!
//! Not for: the JSON report (serialised from `TrainReport` directly).

use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};
use headroom_memory::size::format_bytes;
use headroom_memory::{Category, Device, memory_summary};
use headroom_train::report::TrainReport;
use std::path::Path;

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1} %", 100.0 * part as f64 / whole as f64)
    }
}

/// Prints the report on stdout.
pub fn print_report(report: &TrainReport, device: &Device, timeline: Option<&Path>) {
    let budget = report.device_memory_bytes;
    println!();
    print!("{}", memory_summary(&device.lock()));
    println!();
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "category",
        "at the peak",
        "share",
        "own peak",
        "of budget",
        "predicted at the peak",
    ]);
    // The dry run's breakdown at its peak, next to the measured one.
    let predicted = |c: Category| {
        report
            .predicted_breakdown
            .map_or("-".to_string(), |p| format_bytes(p.at_peak[c]))
    };
    for c in Category::ALL {
        let at = report.memory.breakdown.at_peak[c];
        let own = report.memory.peak_bytes_by_category[c];
        if at == 0 && own == 0 {
            continue;
        }
        table.add_row(vec![
            Cell::new(c.name()),
            Cell::new(format_bytes(at)).set_alignment(CellAlignment::Right),
            Cell::new(percent(at, report.memory.peak_allocated_bytes))
                .set_alignment(CellAlignment::Right),
            Cell::new(format_bytes(own)).set_alignment(CellAlignment::Right),
            Cell::new(percent(own, budget)).set_alignment(CellAlignment::Right),
            Cell::new(predicted(c)).set_alignment(CellAlignment::Right),
        ]);
    }
    table.add_row(vec![
        Cell::new("total allocated"),
        Cell::new(format_bytes(report.memory.peak_allocated_bytes))
            .set_alignment(CellAlignment::Right),
        Cell::new("100.0 %").set_alignment(CellAlignment::Right),
        Cell::new(""),
        Cell::new(percent(report.memory.peak_allocated_bytes, budget))
            .set_alignment(CellAlignment::Right),
        Cell::new(
            report
                .predicted_peak_bytes
                .map_or("-".to_string(), format_bytes),
        )
        .set_alignment(CellAlignment::Right),
    ]);
    println!(
        "Device memory at the peak, by category (budget {}):",
        format_bytes(budget)
    );
    println!("{table}");
    println!(
        "Peak allocated {} and peak reserved {} of the {} budget ({} and {}).",
        format_bytes(report.memory.peak_allocated_bytes),
        format_bytes(report.memory.peak_reserved_bytes),
        format_bytes(budget),
        percent(report.memory.peak_allocated_bytes, budget),
        percent(report.memory.peak_reserved_bytes, budget),
    );
    for r in &report.cache_releases {
        println!(
            "empty_cache after validation at step {}: reserved {} → {}",
            r.step,
            format_bytes(r.reserved_before),
            format_bytes(r.reserved_after)
        );
    }
    if let (Some(first), Some(last)) = (report.losses.first(), report.losses.last()) {
        let predicted = report.auto.as_ref().map_or(String::new(), |a| {
            format!(" (--auto predicted {:.0})", a.predicted_tokens_per_s)
        });
        println!(
            "Training loss {first:.4} → {last:.4} over {} steps; {:.0} tokens/s{predicted}.",
            report.losses.len(),
            report.tokens_per_s
        );
    }
    if let Some(v) = report.val_losses.last() {
        println!("Validation loss {:.4} at step {}.", v.loss, v.step);
    }
    if report.skipped_steps > 0 {
        println!(
            "The loss scaler skipped {} steps with non-finite gradients.",
            report.skipped_steps
        );
    }
    for w in &report.warnings {
        println!("warning: {w}");
    }
    if let Some(path) = timeline {
        println!("Memory timeline: {}", path.display());
    }
}
