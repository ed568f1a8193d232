//! The end-of-run text report of `headroom train`: the allocator's summary table, the bytes per
//! category at the peak and each category's own peak against the budget, the run's losses and
//! throughput, and the data loader's host memory and waiting.
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
    match (report.val_losses.first(), report.val_losses.last()) {
        // A run from pretrained weights is validated before its first step.
        (Some(a), Some(b)) if a.step == 0 && b.step > 0 => println!(
            "Validation loss {:.4} at step 0 → {:.4} at step {}.",
            a.loss, b.loss, b.step
        ),
        (_, Some(v)) => println!("Validation loss {:.4} at step {}.", v.loss, v.step),
        _ => {}
    }
    if report.skipped_steps > 0 {
        println!(
            "The loss scaler skipped {} steps with non-finite gradients.",
            report.skipped_steps
        );
    }
    print_arena(report);
    print_loader(report);
    super::communication::print_communication(report);
    super::offload::print_offload(report);
    for w in &report.warnings {
        println!("warning: {w}");
    }
    if let Some(path) = timeline {
        println!("Memory timeline: {}", path.display());
    }
}

/// `--allocator planned`: the arena against its lower bound, and how the windows went.
fn print_arena(report: &TrainReport) {
    let Some(a) = &report.arena else {
        return;
    };
    let peak = report.memory.peak_allocated_bytes;
    println!(
        "Planned arena {} for a planned peak of {} live ({:.3}×); reserved/allocated at the peak {:.3}. Windows: {} as planned, {} deviated, {} unplanned; {} requests from the arena, {} left to the caching pools.",
        format_bytes(a.arena_bytes),
        format_bytes(a.planned_peak_live),
        a.arena_bytes as f64 / a.planned_peak_live.max(1) as f64,
        report.memory.peak_reserved_bytes as f64 / peak.max(1) as f64,
        a.windows_as_planned,
        a.windows_deviated,
        a.windows_unplanned,
        a.requests_from_arena,
        a.requests_passed_on,
    );
    for d in &a.deviations {
        println!("  deviation: {d}");
    }
    for w in &a.unstable_windows {
        println!("  window \"{w}\" changed between the dry run's steps: not planned");
    }
}

/// The data loader's line: workers and queue, its host bytes, pinning, time waited for data,
/// and the process's peak resident memory.
fn print_loader(report: &TrainReport) {
    let Some(l) = &report.loader else {
        return;
    };
    let wait = report
        .data_wait_fraction()
        .map_or("-".to_string(), |f| format!("{:.1} %", 100.0 * f));
    let pinned = match (&l.staging.pinned, &l.staging.pin_error) {
        (true, _) => "page-locked".to_string(),
        (false, Some(why)) => format!("pageable: {why}"),
        (false, None) => "pageable".to_string(),
    };
    println!(
        "Data: {}, {} workers, queue {} (of --prefetch {}), {} batches, {wait} of step time waiting for data; loader buffers {} ({} per worker, staging peak {}, {pinned}){}.",
        l.source,
        l.workers,
        l.effective_prefetch,
        l.prefetch,
        l.batches,
        format_bytes(l.buffer_bytes),
        format_bytes(l.per_worker_bytes),
        format_bytes(l.staging.peak_bytes),
        if l.mapped_bytes > 0 {
            format!(", {} memory-mapped", format_bytes(l.mapped_bytes))
        } else {
            String::new()
        }
    );
    if let Some(h) = &report.host {
        println!(
            "Host memory of the process: peak RSS {} (now {}: {} anonymous, {} mapped files).",
            format_bytes(h.peak_rss_bytes),
            format_bytes(h.rss_bytes),
            format_bytes(h.rss_anon_bytes),
            format_bytes(h.rss_file_bytes)
        );
    }
}
