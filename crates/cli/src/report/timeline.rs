//! The memory timeline picture: allocated bytes stacked by category over the trace's events,
//! reserved bytes as a line above them, the device capacity as a limit, OOM events marked.
//! Written as SVG.
//!
//! Not for: computing the series (see `headroom_memory::timeline`).

use anyhow::Context;
use headroom_memory::Category;
use headroom_memory::output::write_output;
use headroom_memory::timeline::Timeline;
use plotters::prelude::*;
use std::path::Path;

/// One colour per category, in `Category::ALL` order (colour-blind-safe Okabe–Ito palette plus
/// two greys).
const COLOURS: [RGBColor; Category::COUNT] = [
    RGBColor(0, 114, 178),   // parameter
    RGBColor(230, 159, 0),   // gradient
    RGBColor(86, 180, 233),  // master_weight
    RGBColor(0, 158, 115),   // optimizer_state
    RGBColor(213, 94, 0),    // activation
    RGBColor(204, 121, 167), // temporary
    RGBColor(240, 228, 66),  // input
    RGBColor(120, 120, 120), // communication
    RGBColor(180, 180, 180), // other
];

const MIB: f64 = (1u64 << 20) as f64;

/// Renders `timeline` to an SVG file at `path` (written atomically).
pub fn write_timeline_svg(
    timeline: &Timeline,
    capacity: Option<u64>,
    title: &str,
    path: &Path,
) -> anyhow::Result<()> {
    let mut svg = String::new();
    draw(timeline, capacity, title, &mut svg)
        .map_err(|e| anyhow::anyhow!("cannot draw the timeline: {e}"))?;
    write_output(path, svg.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

fn draw(
    timeline: &Timeline,
    capacity: Option<u64>,
    title: &str,
    out: &mut String,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(out, (1100, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let points = &timeline.points;
    let x_max = points.last().map_or(1, |p| p.event.max(1)) as f64;
    let y_top = points
        .iter()
        .map(|p| p.reserved.max(p.allocated()))
        .max()
        .unwrap_or(0)
        .max(capacity.unwrap_or(0));
    let y_max = (y_top as f64 / MIB * 1.08).max(1.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("allocator event")
        .y_desc("MiB")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;

    // Stacked areas: draw cumulative sums from the top category down so lower ones cover.
    let active: Vec<usize> = (0..Category::COUNT)
        .filter(|&c| points.iter().any(|p| p.by_category[c] > 0))
        .collect();
    for (k, &c) in active.iter().enumerate().rev() {
        let series = points.iter().map(|p| {
            let stacked: u64 = active[..=k].iter().map(|&i| p.by_category[i]).sum();
            (p.event as f64, stacked as f64 / MIB)
        });
        chart
            .draw_series(
                AreaSeries::new(series, 0.0, COLOURS[c].mix(0.85)).border_style(COLOURS[c]),
            )?
            .label(Category::ALL[c].name())
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 12, y + 5)], COLOURS[c].filled())
            });
    }
    chart
        .draw_series(LineSeries::new(
            points
                .iter()
                .map(|p| (p.event as f64, p.reserved as f64 / MIB)),
            BLACK.stroke_width(2),
        ))?
        .label("reserved")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], BLACK.stroke_width(2)));
    if let Some(cap) = capacity {
        let y = cap as f64 / MIB;
        chart
            .draw_series(LineSeries::new([(0.0, y), (x_max, y)], RED.stroke_width(2)))?
            .label("capacity")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], RED.stroke_width(2)));
    }
    for &oom in &timeline.ooms {
        let x = oom as f64;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, 0.0), (x, y_max)],
            RED.mix(0.6),
        )))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    root.present()?;
    Ok(())
}
