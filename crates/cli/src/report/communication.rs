//! The data-parallel part of `headroom train`'s text report: what rank 0 communicated per step
//! against the ZeRO paper's volume, the time spent inside collectives, and every rank's peaks;
//! for a tensor-parallel run, the mesh and every rank's peaks.
//!
//! Not for: single-process runs (nothing is printed) or the JSON report.

use crate::commands::plan_output::group_digits;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_memory::size::format_bytes;
use headroom_train::report::TrainReport;

/// Prints the communication line and the per-rank table of a data-parallel run.
pub fn print_communication(report: &TrainReport) {
    let Some(c) = &report.communication else {
        // A split model's ranks form no data-parallel group: the mesh and their peaks.
        if report.ranks.len() > 1 {
            let n = report.ranks.len();
            println!(
                "Mesh: tp {n} × dp 1 (the model's layers split over {n} ranks); every rank's peaks:"
            );
            print_rank_peaks(report);
        }
        return;
    };
    let stage = match c.zero_stage.shards_optimizer() {
        false => "DDP".to_string(),
        true => format!("ZeRO-{}", c.zero_stage),
    };
    let ratio = if c.theory_elements_per_step > 0.0 {
        format!(
            " ({:.3}× the {} elements of theory)",
            c.sent_elements_per_step / c.theory_elements_per_step,
            group(c.theory_elements_per_step)
        )
    } else {
        String::new()
    };
    println!(
        "Communication ({stage}, {} ranks, rank 0): {} collectives per step sending {} elements ({}) on a ring{ratio}; {:.3} s inside collectives, {:.1} % of step time.",
        c.world_size,
        group(c.counts.calls() as f64 / c.steps.max(1) as f64),
        group(c.sent_elements_per_step),
        format_bytes(c.sent_bytes_per_step as u64),
        c.collective_s,
        100.0 * c.collective_fraction
    );
    print_rank_peaks(report);
}

/// Every rank's peaks and time inside collectives, as a table (nothing without ranks).
fn print_rank_peaks(report: &TrainReport) {
    if report.ranks.is_empty() {
        return;
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "rank",
        "peak allocated",
        "peak reserved",
        "in collectives",
    ]);
    for r in &report.ranks {
        table.add_row(vec![
            r.rank.to_string(),
            format_bytes(r.peak_allocated_bytes),
            format_bytes(r.peak_reserved_bytes),
            format!("{:.3} s", r.collective_ns as f64 * 1e-9),
        ]);
    }
    println!("{table}");
}

/// `x` rounded, with thousands separated.
fn group(x: f64) -> String {
    group_digits(x.round() as u64)
}
