//! Line charts on log-log axes (SVG), for benchmark curves such as memory against depth.
//!
//! Not for: the memory timeline (see `timeline`).

use anyhow::Context;
use headroom_memory::output::write_output;
use plotters::prelude::*;
use std::path::Path;

const COLOURS: [RGBColor; 6] = [
    RGBColor(213, 94, 0),
    RGBColor(0, 114, 178),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
];

/// Draws each named series of (x, y) points with markers on log-log axes.
pub fn write_loglog_svg(
    series: &[(String, Vec<(f64, f64)>)],
    title: &str,
    x_label: &str,
    y_label: &str,
    path: &Path,
) -> anyhow::Result<()> {
    let mut svg = String::new();
    draw(series, title, x_label, y_label, &mut svg)
        .map_err(|e| anyhow::anyhow!("cannot draw {title}: {e}"))?;
    write_output(path, svg.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

fn draw(
    series: &[(String, Vec<(f64, f64)>)],
    title: &str,
    x_label: &str,
    y_label: &str,
    out: &mut String,
) -> Result<(), Box<dyn std::error::Error>> {
    let all = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (1.0, 10.0, 1.0, 10.0);
    }
    let root = SVGBackend::with_string(out, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x0 / 1.2..x1 * 1.2).log_scale(),
            (y0 / 1.5..y1 * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 14, y)], colour.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
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
