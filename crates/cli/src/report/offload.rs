//! The offload part of `headroom train`'s text report: bytes per category on each tier (the
//! device's own peaks next to the host's and the disk's), the swap buffers, and for each store
//! what moved, how fast, how much of it the update waited for, and whether direct I/O and page
//! locking were granted (with the reason when not).
//!
//! Activation offload gets one line: the checkpointed inputs' most bytes on the host beside the
//! device's activation peak.
//!
//! Not for: runs without offload (nothing is printed) or the JSON report.

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_memory::Category;
use headroom_memory::size::format_bytes;
use headroom_train::report::TrainReport;

const CATEGORIES: [Category; 4] = [
    Category::Parameter,
    Category::Gradient,
    Category::MasterWeight,
    Category::OptimizerState,
];

/// Prints the tiers table and one line per store of an offloaded run.
pub fn print_offload(report: &TrainReport) {
    if let Some(host) = report.offloaded_activations_peak_bytes {
        println!(
            "Activation offload: checkpointed block inputs held up to {} in host memory; device activation peak {}",
            format_bytes(host),
            format_bytes(report.memory.peak_bytes_by_category[Category::Activation])
        );
    }
    let Some(o) = &report.offload else {
        return;
    };
    let device = report.memory.peak_bytes_by_category;
    let mut table = Table::new();
    let mut header = vec!["tier".to_string()];
    header.extend(CATEGORIES.iter().map(|c| c.to_string()));
    header.extend(["swap buffers".to_string(), "total".to_string()]);
    table.load_preset(UTF8_FULL_CONDENSED).set_header(header);
    let row = |name: &str, bytes: &headroom_memory::CategoryBytes, swap: u64| {
        let mut r = vec![name.to_string()];
        r.extend(CATEGORIES.iter().map(|&c| format_bytes(bytes[c])));
        r.push(format_bytes(swap));
        r.push(format_bytes(
            CATEGORIES.iter().map(|&c| bytes[c]).sum::<u64>() + swap,
        ));
        r
    };
    table.add_row(row("device (each category's peak)", &device, 0));
    table.add_row(row("host", &o.host, o.swap_bytes));
    table.add_row(row("disk", &o.disk, 0));
    println!("Offload tiers (rank 0):\n{table}");
    for s in &o.stores {
        let moved = s.bytes_read + s.bytes_written;
        let rate = match s.io_seconds {
            t if t > 0.0 => format!(", {:.2} GB/s in transfers", moved as f64 / t / 1e9),
            _ => String::new(),
        };
        let io = match (&s.path, s.direct_io, &s.buffered_reason) {
            (None, ..) => String::new(),
            (Some(p), true, _) => format!("; {p}, direct I/O"),
            (Some(p), false, why) => format!("; {p}, {}", why.as_deref().unwrap_or("buffered I/O")),
        };
        let pinned = match (&s.pin_error, s.pinned) {
            (_, true) => "page-locked".to_string(),
            (Some(why), false) => format!("pageable: {why}"),
            (None, false) => "pageable".to_string(),
        };
        println!(
            "  {} on {}: read {}, wrote {}{rate}; waited {:.3} s of {:.3} s of transfers ({:.0} % hidden){io}; host buffers {pinned}.",
            s.name,
            s.tier,
            format_bytes(s.bytes_read),
            format_bytes(s.bytes_written),
            s.waited_seconds,
            s.io_seconds,
            100.0 * s.hidden_fraction(),
        );
    }
    if o.gradient_buffers > 0 {
        println!(
            "  gradients to the host: {} buffers of {}; {:.3} s copying, {:.0} % hidden behind the update.",
            o.gradient_buffers,
            format_bytes(o.gradient_buffer_bytes),
            o.gradient_copy_seconds,
            100.0 * o.gradient_hidden_fraction()
        );
    }
}
