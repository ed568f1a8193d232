//! `memory_summary()`: the layout of `torch.cuda.memory_summary()` (75-character table, nine
//! metrics with large/small pool rows, oversize rows, PyTorch's unit rules), followed by a
//! per-category section and the fragmentation figures.
//!
//! Not for: machine-readable output (use `DeviceStats::flat` and JSON).

use crate::allocator::CachingAllocator;
use crate::category::Category;
use crate::fragmentation::Fragmentation;
use crate::size::format_bytes;
use crate::stats::{Stat, StatArray};
use std::fmt::Write;

const WIDTH: usize = 75;

/// PyTorch's byte format: a 6-wide integer and a unit that moves up while the value is at least
/// 768 × 1024 of the current unit.
fn format_bytes_cell(value: i64, unit_from: i64) -> String {
    const UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    let mut reference = unit_from.unsigned_abs();
    let mut divisor = 1u64;
    while reference >= 768 * 1024 && unit + 1 < UNITS.len() {
        reference /= 1024;
        divisor *= 1024;
        unit += 1;
    }
    format!("{:>6} {}", value / divisor as i64, UNITS[unit])
}

/// PyTorch's count format: a 7-wide integer and a suffix (` `, `K`, `M`) moving up at ≥ 750 × 1000.
fn format_count_cell(value: i64, unit_from: i64) -> String {
    const UNITS: [&str; 3] = [" ", "K", "M"];
    let mut unit = 0;
    let mut reference = unit_from.unsigned_abs();
    let mut divisor = 1u64;
    while reference >= 750 * 1000 && unit + 1 < UNITS.len() {
        reference /= 1000;
        divisor *= 1000;
        unit += 1;
    }
    format!("{:>7} {}", value / divisor as i64, UNITS[unit])
}

fn line(out: &mut String, ch: char) {
    let _ = writeln!(out, "|{}|", ch.to_string().repeat(WIDTH));
}

fn centered(out: &mut String, text: &str) {
    let _ = writeln!(out, "|{text:^WIDTH$}|");
}

fn row(out: &mut String, label: &str, cells: [String; 4]) {
    let _ = writeln!(
        out,
        "| {label:<21} | {} | {} | {} | {} |",
        cells[0], cells[1], cells[2], cells[3]
    );
}

fn stat_cells(stat: &Stat, unit_from: &Stat, bytes: bool) -> [String; 4] {
    let f = |v: i64, u: i64| {
        if bytes {
            format_bytes_cell(v, u)
        } else {
            format_count_cell(v, u)
        }
    };
    [
        f(stat.current, unit_from.current),
        f(stat.peak, unit_from.peak),
        f(stat.allocated, unit_from.allocated),
        f(stat.freed, unit_from.freed),
    ]
}

fn metric(out: &mut String, label: &str, array: &StatArray, bytes: bool) {
    row(out, label, stat_cells(&array.all, &array.all, bytes));
    row(
        out,
        "      from large pool",
        stat_cells(&array.large_pool, &array.all, bytes),
    );
    row(
        out,
        "      from small pool",
        stat_cells(&array.small_pool, &array.all, bytes),
    );
    line(out, '-');
}

/// The summary table for one device.
pub fn memory_summary(allocator: &CachingAllocator) -> String {
    let s = allocator.stats();
    let mut out = String::new();
    line(&mut out, '=');
    centered(
        &mut out,
        &format!(
            "headroom memory summary, device {}",
            allocator.device_name()
        ),
    );
    line(&mut out, '-');
    let left = format!("OOMs: {}", s.num_ooms);
    let right = format!("allocation retries: {}", s.num_alloc_retries);
    let _ = writeln!(out, "|{left:^36}|{right:^38}|");
    line(&mut out, '=');
    let _ = writeln!(
        out,
        "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |"
    );
    line(&mut out, '-');
    metric(&mut out, "Allocated memory", &s.allocated_bytes, true);
    metric(&mut out, "Active memory", &s.active_bytes, true);
    metric(&mut out, "Requested memory", &s.requested_bytes, true);
    metric(&mut out, "Reserved memory", &s.reserved_bytes, true);
    metric(
        &mut out,
        "Non-releasable memory",
        &s.inactive_split_bytes,
        true,
    );
    metric(&mut out, "Allocations", &s.allocation, false);
    metric(&mut out, "Active allocs", &s.active, false);
    metric(&mut out, "Reserved segments", &s.segment, false);
    metric(&mut out, "Non-releasable allocs", &s.inactive_split, false);
    row(
        &mut out,
        "Oversize allocations",
        stat_cells(&s.oversize_allocations, &s.oversize_allocations, false),
    );
    line(&mut out, '-');
    row(
        &mut out,
        "Oversize segments",
        stat_cells(&s.oversize_segments, &s.oversize_segments, false),
    );
    line(&mut out, '=');

    // Per-category section: current, each category's own peak, and its share at the peak.
    let _ = writeln!(
        out,
        "|       Category        | Cur Usage  | Peak Usage | At the peak (all)       |"
    );
    line(&mut out, '-');
    let peak_total = s.allocated_bytes.all.peak;
    for c in Category::ALL {
        let stat = &s.category_bytes[c.index()];
        let at_peak = s.category_bytes_at_peak[c] as i64;
        let share = if peak_total > 0 {
            100.0 * at_peak as f64 / peak_total as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "| {:<21} | {} | {} | {} {:>5.1} %      |",
            c.name(),
            format_bytes_cell(stat.current, stat.current),
            format_bytes_cell(stat.peak, stat.peak),
            format_bytes_cell(at_peak, peak_total),
            share
        );
    }
    line(&mut out, '=');

    let f = Fragmentation::of(allocator);
    let frag = [
        ("Rounding waste", format_bytes(f.rounding_waste_bytes)),
        (
            "Cached, unallocated",
            format_bytes(f.cached_unallocated_bytes),
        ),
        ("Non-releasable", format_bytes(f.non_releasable_bytes)),
        (
            "Largest free block",
            format_bytes(f.largest_free_block_bytes),
        ),
        (
            "Largest / total free",
            format!("{:.3}", f.largest_free_ratio),
        ),
        (
            "Peak reserved/alloc",
            format!("{:.3}", f.peak_reserved_over_allocated),
        ),
    ];
    centered(&mut out, "Fragmentation");
    line(&mut out, '-');
    for (label, value) in frag {
        let _ = writeln!(out, "| {label:<21} | {value:<49} |");
    }
    line(&mut out, '=');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_follow_pytorch_unit_rules() {
        // 300 GiB still prints in MiB: 300 GiB < 768 × 1024 MiB.
        let v = 300i64 << 30;
        assert_eq!(format_bytes_cell(v, v), "307200 MiB");
        assert_eq!(format_bytes_cell(1 << 20, 1 << 20), "  1024 KiB");
        assert_eq!(format_bytes_cell(512, 512), "   512 B  ");
        assert_eq!(format_count_cell(7_400_000, 7_400_000), "   7400 K");
        assert_eq!(format_count_cell(1922, 1922), "   1922  ");
    }
}
