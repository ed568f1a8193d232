//! `memory doctor --html`: the diagnosis as one self-contained page — inline CSS and an inline
//! SVG timeline of the live bytes by category (a stacked area over the trace's events, the peak
//! marked), the peak's attribution, the findings (what is kept across steps with its mistake,
//! file, line and fix; the fragmentation verdict; the levers for the run), the largest call
//! sites, and what could not be attributed. No script and nothing fetched from the network.
//!
//! Not for: the text or JSON reports (see `doctor`), or the analyses themselves.

use crate::commands::doctor::Report;
use crate::commands::doctor_text::{
    carried_by, carried_sites, finding_amount, fragmentation_lines, frame, mistake_name, share,
    signed_bytes,
};
use headroom_memory::Category;
use headroom_memory::doctor::{Diagnosis, Sample};
use headroom_memory::size::format_bytes;
use std::fmt::Write as _;
use std::path::Path;

/// One colour per category, in `Category::ALL` order.
const COLOURS: [&str; Category::COUNT] = [
    "#4e79a7", "#f28e2b", "#76b7b2", "#e15759", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f",
];

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 300.0;
const LEFT: f64 = 80.0;
const BOTTOM: f64 = 30.0;
const TOP: f64 = 10.0;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}\
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .6em;text-align:left;border-bottom:1px solid #eee}\
td.n{text-align:right;font-variant-numeric:tabular-nums}code{background:#f4f4f4;padding:0 .2em}\
.finding{border-left:4px solid #e15759;padding:.3em .8em;margin:.6em 0;background:#fff7f7}\
.fix{font-weight:600}.fit{background:#eef8ee}.legend span{display:inline-block;margin-right:1em}\
.swatch{display:inline-block;width:.8em;height:.8em;margin-right:.3em;vertical-align:middle}";

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// The stacked-area timeline of `samples` over `events` events, as inline SVG.
pub fn timeline_svg(samples: &[Sample], events: usize, peak: Option<(usize, u64)>) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="live bytes by category over the trace's events">"#
    );
    let max = samples
        .iter()
        .map(|s| s.by_category.iter().sum::<u64>())
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = WIDTH - LEFT - 10.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let span = events.saturating_sub(1).max(1) as f64;
    let x = |i: usize| LEFT + plot_w * i as f64 / span;
    let y = |b: u64| TOP + plot_h * (1.0 - b as f64 / max as f64);
    // One polygon per category: its upper edge left to right, its lower edge back.
    let mut below = vec![0u64; samples.len()];
    for c in Category::ALL {
        if samples.iter().all(|s| s.by_category[c.index()] == 0) {
            continue;
        }
        let above: Vec<u64> = samples
            .iter()
            .zip(&below)
            .map(|(s, b)| b + s.by_category[c.index()])
            .collect();
        let mut points = String::new();
        for (s, top) in samples.iter().zip(&above) {
            let _ = write!(points, "{:.1},{:.1} ", x(s.event_index), y(*top));
        }
        for (s, bottom) in samples.iter().zip(&below).rev() {
            let _ = write!(points, "{:.1},{:.1} ", x(s.event_index), y(*bottom));
        }
        let _ = write!(
            o,
            r#"<polygon points="{}" fill="{}" fill-opacity="0.85"><title>{}</title></polygon>"#,
            points.trim_end(),
            COLOURS[c.index()],
            c
        );
        below = above;
    }
    // Axes: bytes at the top and the bottom, events at both ends.
    let _ = write!(
        o,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{b}" stroke="#444"/><line x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}" stroke="#444"/>"##,
        b = TOP + plot_h,
        r = LEFT + plot_w
    );
    let _ = write!(
        o,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="end">{}</text><text x="{}" y="{}" font-size="11" text-anchor="end">0</text>"#,
        LEFT - 4.0,
        TOP + 10.0,
        escape(&format_bytes(max)),
        LEFT - 4.0,
        TOP + plot_h
    );
    let _ = write!(
        o,
        r#"<text x="{LEFT}" y="{}" font-size="11">event 0</text><text x="{}" y="{}" font-size="11" text-anchor="end">event {}</text>"#,
        HEIGHT - 8.0,
        LEFT + plot_w,
        HEIGHT - 8.0,
        events.saturating_sub(1)
    );
    if let Some((at, bytes)) = peak {
        let _ = write!(
            o,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{b}" stroke="#000" stroke-dasharray="4 3"/><text x="{px:.1}" y="{ty:.1}" font-size="11" text-anchor="middle">peak {}</text>"##,
            escape(&format_bytes(bytes)),
            px = x(at),
            b = TOP + plot_h,
            ty = (y(bytes) - 3.0).max(TOP + 9.0)
        );
    }
    o.push_str("</svg>");
    o
}

fn legend(d: &Diagnosis) -> String {
    let mut o = String::from(r#"<div class="legend">"#);
    for c in Category::ALL {
        if d.timeline.iter().any(|s| s.by_category[c.index()] > 0) {
            let _ = write!(
                o,
                r#"<span><i class="swatch" style="background:{}"></i>{}</span>"#,
                COLOURS[c.index()],
                c
            );
        }
    }
    o.push_str("</div>");
    o
}

fn peak_section(d: &Diagnosis, o: &mut String) {
    let _ = write!(o, "<h2>The peak</h2>");
    let Some(p) = &d.peak else {
        o.push_str("<p>Nothing was allocated.</p>");
        return;
    };
    let phase = p.phase.map_or("phase unknown", |ph| ph.name());
    let _ = write!(
        o,
        "<p id=\"peak\">{} allocated at event {} (step {}, {})</p><table><tr><th>category</th><th>bytes</th><th>share</th></tr>",
        escape(&format_bytes(p.allocated_bytes)),
        p.event_index,
        p.step,
        escape(phase)
    );
    let mut cats: Vec<_> = p.by_category.iter().filter(|(_, b)| *b > 0).collect();
    cats.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    for (c, b) in cats {
        let _ = write!(
            o,
            "<tr><td>{c}</td><td class=n>{}</td><td class=n>{}</td></tr>",
            escape(&format_bytes(*b)),
            escape(&share(*b, p.allocated_bytes))
        );
    }
    o.push_str("</table><h2>Largest call sites alive at the peak</h2><table id=\"sites\"><tr><th>bytes</th><th>blocks</th><th>call site</th><th>via</th><th>category</th></tr>");
    for s in &p.sites {
        let via = match &s.innermost {
            Some(f) if Some(f) != s.frame.as_ref() => format!("{} ({})", f.filename, f.name),
            _ => String::new(),
        };
        let _ = write!(
            o,
            "<tr><td class=n>{}</td><td class=n>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            escape(&format_bytes(s.bytes)),
            s.count,
            escape(&frame(&s.frame)),
            escape(&via),
            s.category
        );
    }
    o.push_str("</table>");
    if let Some(c) = &d.carryover {
        let _ = write!(
            o,
            "<p id=\"carryover\">Held from the previous step at the peak: {} ({}), made at <code>{}</code>{}. Fix: {}</p>",
            escape(&format_bytes(c.bytes)),
            escape(&share(c.bytes, p.allocated_bytes)),
            escape(&carried_sites(c)),
            carried_by(c).map_or(String::new(), |k| format!(
                ", kept by <code>{}</code>",
                escape(&k)
            )),
            escape(c.fix)
        );
    }
}

fn leaks_section(d: &Diagnosis, o: &mut String) {
    let l = &d.leaks;
    o.push_str("<h2>Leaks and retention</h2>");
    let ends: Vec<String> = l
        .bytes_at_step_end
        .iter()
        .map(|b| format_bytes(*b))
        .collect();
    let _ = write!(
        o,
        "<p>Allocated at each step's end: {}</p>",
        escape(&ends.join(", "))
    );
    if let Some(g) = l.growth_per_step {
        let _ = write!(
            o,
            "<p>Growing by {} per step.</p>",
            escape(&format_bytes(g))
        );
    }
    if l.findings.is_empty() {
        let text = match &l.unchecked {
            Some(why) => format!("Not checked: {why}"),
            None => "Nothing is kept across steps.".into(),
        };
        let _ = write!(o, "<p id=\"no-leak\">{}</p>", escape(&text));
    }
    for f in &l.findings {
        let _ = write!(
            o,
            "<div class=\"finding\"><p><b>{}</b>: {}</p><p>made at <code>{}</code>",
            escape(mistake_name(f.mistake)),
            escape(&finding_amount(f)),
            escape(&frame(&f.frame))
        );
        if let Some(code) = &f.code {
            let _ = write!(o, " <code>{}</code>", escape(code));
        }
        o.push_str("</p>");
        if let (Some((line, code)), Some(fr)) = (&f.kept_at, &f.frame) {
            let _ = write!(
                o,
                "<p>kept at <code>{}:{line}</code> <code>{}</code></p>",
                escape(&fr.filename),
                escape(code)
            );
        }
        let _ = write!(o, "<p class=\"fix\">fix: {}</p></div>", escape(f.fix));
    }
}

fn levers_section(r: &Report, o: &mut String) {
    let Some(run) = &r.run else {
        return;
    };
    let l = &run.levers;
    let _ = write!(
        o,
        "<h2>Levers for this run</h2><p>{} on {} ({} usable): the stated strategy needs {}, and {}. Each lever alone on the stated strategy, cheapest first (the order of Hugging Face's <a href=\"https://huggingface.co/docs/transformers/perf_train_gpu_one\">Methods and tools for efficient training on a single GPU</a>).</p>",
        escape(&run.model),
        escape(&run.device),
        escape(&format_bytes(l.usable_bytes)),
        escape(&format_bytes(l.stated_peak_bytes)),
        if l.stated_fits {
            "fits"
        } else {
            "does not fit"
        }
    );
    o.push_str("<table id=\"levers\"><tr><th>#</th><th>lever</th><th>change</th><th>peak</th><th>saves</th><th>fits</th></tr>");
    for (i, lever) in l.levers.iter().enumerate() {
        let class = if l.first_fit == Some(i) {
            " class=\"fit\""
        } else {
            ""
        };
        match (lever.peak_bytes, lever.saving_bytes) {
            (Some(peak), Some(saving)) => {
                let _ = write!(
                    o,
                    "<tr{class}><td>{}</td><td>{}</td><td><code>{}</code></td><td class=n>{}</td><td class=n>{}</td><td>{}</td></tr>",
                    i + 1,
                    escape(lever.lever.name()),
                    escape(&lever.change),
                    escape(&format_bytes(peak)),
                    escape(&signed_bytes(saving)),
                    match (lever.fits, l.first_fit == Some(i)) {
                        (true, true) => "first that fits",
                        (true, false) => "fits",
                        _ => "no",
                    }
                );
            }
            _ => {
                let _ = write!(
                    o,
                    "<tr><td>{}</td><td>{}</td><td colspan=4>does not apply: {}</td></tr>",
                    i + 1,
                    escape(lever.lever.name()),
                    escape(&lever.change)
                );
            }
        }
    }
    o.push_str("</table>");
    if l.first_fit.is_none() {
        o.push_str("<p>No lever fits alone: combine them (<code>headroom plan</code> searches the combinations).</p>");
    }
    if !run.mismatches.is_empty() {
        o.push_str("<p>The side JSON against the trace:</p><ul>");
        for m in &run.mismatches {
            let _ = write!(o, "<li>{}</li>", escape(m));
        }
        o.push_str("</ul>");
    }
}

/// The whole page.
pub fn page(path: &Path, r: &Report) -> String {
    let d = &r.diagnosis;
    let title = format!("headroom memory doctor: {}", path.display());
    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body><h1>{}</h1><p>{} events, {} step{}</p>",
        escape(&title),
        escape(&title),
        d.events,
        d.steps,
        if d.steps == 1 { "" } else { "s" }
    );
    o.push_str("<h2>Live bytes by category</h2>");
    o.push_str(&timeline_svg(
        &d.timeline,
        d.events,
        d.peak.as_ref().map(|p| (p.event_index, p.allocated_bytes)),
    ));
    o.push_str(&legend(d));
    peak_section(d, &mut o);
    leaks_section(d, &mut o);
    let mut lines = fragmentation_lines(&d.fragmentation).into_iter();
    if let Some(head) = lines.next() {
        let _ = write!(o, "<h2>{}</h2><ul id=\"fragmentation\">", escape(&head));
        for line in lines {
            let _ = write!(o, "<li>{}</li>", escape(line.trim()));
        }
        o.push_str("</ul>");
    }
    levers_section(r, &mut o);
    if !d.limits.is_empty() {
        o.push_str("<h2>Not attributed</h2><ul>");
        for l in &d.limits {
            let _ = write!(o, "<li>{}</li>", escape(l));
        }
        o.push_str("</ul>");
    }
    o.push_str("</body></html>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn the_areas_stack_and_the_peak_reaches_the_top() {
        let mut a = [0u64; Category::COUNT];
        a[Category::Parameter.index()] = 100;
        let mut b = a;
        b[Category::Activation.index()] = 100;
        let samples = [
            Sample {
                event_index: 0,
                by_category: a,
            },
            Sample {
                event_index: 9,
                by_category: b,
            },
        ];
        let svg = timeline_svg(&samples, 10, Some((9, 200)));
        // Two categories, two polygons; the activation's top at event 9 is the plot's top
        // (200 bytes of 200), at x = LEFT + plot width.
        assert_eq!(svg.matches("<polygon").count(), 2);
        let top = format!("{:.1},{:.1}", WIDTH - 10.0, TOP);
        assert!(svg.contains(&top), "{svg}");
        // The activation's lower edge at event 9 sits on the parameter's top: half height.
        let mid = format!(
            "{:.1},{:.1}",
            WIDTH - 10.0,
            TOP + (HEIGHT - TOP - BOTTOM) / 2.0
        );
        assert!(svg.contains(&mid), "{svg}");
    }
}
