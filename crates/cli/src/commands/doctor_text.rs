//! `headroom memory doctor`'s text report: the diagnosis (the peak attributed, what the
//! previous step still holds there, leaks with their mistake and fix, fragmentation by replay)
//! and the levers ranked for the run, as lines for people; the helpers the HTML page shares.
//!
//! Not for: running the doctor or reading its inputs (`doctor`), the page (`doctor_html`).

use crate::commands::doctor_side::RunReport;
use headroom_memory::doctor::{
    Carryover, Diagnosis, Finding, FragmentationReport, Frame, Mistake, ReplayFigures,
};
use headroom_memory::size::format_bytes;
use std::path::Path;

/// The call sites that made what the previous step holds at the peak, with their bytes.
pub fn carried_sites(c: &Carryover) -> String {
    c.sites
        .iter()
        .map(|s| format!("{} ({})", frame(&s.frame), format_bytes(s.bytes)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The loop's line that keeps what the previous step holds, with its code where the file was
/// at hand.
pub fn carried_by(c: &Carryover) -> Option<String> {
    let f = c.kept_by.as_ref()?;
    let code = c.code.as_ref().map_or(String::new(), |l| format!(": {l}"));
    Some(format!("{}:{} ({}){code}", f.filename, f.line, f.name))
}

/// A frame as `file:line (function)`.
pub fn frame(f: &Option<Frame>) -> String {
    match f {
        Some(f) => format!("{}:{} ({})", f.filename, f.line, f.name),
        None => "no Python frame (autograd's backward thread)".into(),
    }
}

/// `part` as a percentage of `whole`.
pub fn share(part: u64, whole: u64) -> String {
    match whole {
        0 => "0 %".into(),
        _ => format!("{:.0} %", 100.0 * part as f64 / whole as f64),
    }
}

/// The text report.
pub fn render(path: &Path, d: &Diagnosis) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let phases = match (d.phases_stated, d.has_frames) {
        (true, _) => "phases as the trace states them",
        (false, true) => "phases read from the Python stacks",
        (false, false) => "no phases",
    };
    let _ = writeln!(
        o,
        "{}: {} events, {} step{} ({phases})",
        path.display(),
        d.events,
        d.steps,
        if d.steps == 1 { "" } else { "s" }
    );
    let _ = writeln!(o);
    match &d.peak {
        None => {
            let _ = writeln!(o, "Peak: nothing was allocated.");
        }
        Some(p) => {
            let phase = p
                .phase
                .map_or("phase unknown".into(), |ph| ph.name().to_string());
            let _ = writeln!(
                o,
                "Peak: {} allocated at event {} (step {}, {phase})",
                format_bytes(p.allocated_bytes),
                p.event_index,
                p.step
            );
            let mut cats: Vec<_> = p.by_category.iter().filter(|(_, b)| *b > 0).collect();
            cats.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
            let cats: Vec<String> = cats
                .iter()
                .map(|(c, b)| {
                    format!(
                        "{c} {} ({})",
                        format_bytes(*b),
                        share(*b, p.allocated_bytes)
                    )
                })
                .collect();
            let _ = writeln!(o, "  by category: {}", cats.join(", "));
            let _ = writeln!(o, "  largest call sites alive at the peak:");
            for s in &p.sites {
                let via = match &s.innermost {
                    Some(f) if Some(f) != s.frame.as_ref() => {
                        format!("  via {} ({})", f.filename, f.name)
                    }
                    _ => String::new(),
                };
                let _ = writeln!(
                    o,
                    "    {:>10}  {:>5} block{}  {}  [{}]{via}",
                    format_bytes(s.bytes),
                    s.count,
                    if s.count == 1 { " " } else { "s" },
                    frame(&s.frame),
                    s.category
                );
            }
            if let Some(c) = &d.carryover {
                let _ = writeln!(
                    o,
                    "  held from the previous step: {} ({}), made at {}",
                    format_bytes(c.bytes),
                    share(c.bytes, p.allocated_bytes),
                    carried_sites(c)
                );
                if let Some(k) = carried_by(c) {
                    let _ = writeln!(o, "    kept by {k}");
                }
                let _ = writeln!(o, "    fix: {}", c.fix);
            }
        }
    }
    let _ = writeln!(o);
    let l = &d.leaks;
    let ends: Vec<String> = l
        .bytes_at_step_end
        .iter()
        .map(|b| format_bytes(*b))
        .collect();
    let _ = writeln!(
        o,
        "Leaks: allocated at each step's end: {}",
        ends.join(", ")
    );
    if let Some(g) = l.growth_per_step {
        let _ = writeln!(o, "  growing by {} per step", format_bytes(g));
    }
    if l.findings.is_empty() {
        let _ = writeln!(
            o,
            "  {}",
            match &l.unchecked {
                Some(why) => format!("not checked: {why}"),
                None => "nothing is kept across steps".into(),
            }
        );
    }
    for (i, f) in l.findings.iter().enumerate() {
        let _ = write!(o, "{}", finding(i + 1, f));
    }
    let _ = writeln!(o);
    for line in fragmentation_lines(&d.fragmentation) {
        let _ = writeln!(o, "{line}");
    }
    if !d.limits.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(o, "Not attributed:");
        for limit in &d.limits {
            let _ = writeln!(o, "  - {limit}");
        }
    }
    o
}

/// The fragmentation verdict, one sentence a line (the first is the heading).
pub fn fragmentation_lines(fr: &FragmentationReport) -> Vec<String> {
    let mut lines = Vec::new();
    let capacity = fr.capacity_bytes.map_or("no capacity given".into(), |c| {
        format!("capacity {}", format_bytes(c))
    });
    lines.push(format!(
        "Fragmentation (replayed through the caching allocator, {capacity}):"
    ));
    let c = &fr.caching;
    lines.push(format!(
        "  peak reserved {} for {} allocated ({:.2}×); at the peak {} cached and unused, {} of it not releasable by empty_cache",
        format_bytes(c.peak_reserved_bytes),
        format_bytes(c.peak_allocated_bytes),
        c.fragmentation.peak_reserved_over_allocated,
        format_bytes(c.fragmentation.cached_unallocated_bytes),
        format_bytes(c.fragmentation.non_releasable_bytes)
    ));
    match &c.first_oom {
        None if fr.capacity_bytes.is_some() => {
            lines.push("  no out-of-memory at this capacity".into());
        }
        None => {}
        Some(oom) => {
            let phase = oom
                .phase
                .map_or("phase unknown".into(), |p| p.name().to_string());
            lines.push(format!("  out of memory at event {} ({phase}): {} requested with {} allocated and {} reserved; the largest free block was {}",
                oom.event_index,
                format_bytes(oom.requested_bytes),
                format_bytes(oom.allocated_bytes),
                format_bytes(oom.reserved_bytes),
                format_bytes(oom.largest_free_block_bytes)
            ));
            if oom.frame.is_some() {
                lines.push(format!("  requested at {}", frame(&oom.frame)));
            }
            lines.push(format!(
                "  {}",
                if oom.fragmentation_bound {
                    "the bytes existed, not in one piece: fragmentation"
                } else {
                    "the bytes themselves were missing: fragmentation is not the cause"
                }
            ));
            lines.push(format!(
                "  with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): {}",
                outcome(&fr.expandable)
            ));
            if let Some(e) = &fr.emptied_before_failing_phase {
                lines.push(format!(
                    "  with torch.cuda.empty_cache() when that phase began: {}",
                    outcome(e)
                ));
            }
        }
    }
    lines
}

/// A replay's outcome in words.
pub fn outcome(r: &ReplayFigures) -> String {
    match &r.first_oom {
        None => format!(
            "no out-of-memory (peak reserved {})",
            format_bytes(r.peak_reserved_bytes)
        ),
        Some(oom) => format!(
            "still out of memory at event {} ({} requested)",
            oom.event_index,
            format_bytes(oom.requested_bytes)
        ),
    }
}

/// The mistake a finding looks like, in words.
pub fn mistake_name(m: Mistake) -> &'static str {
    use headroom_memory::doctor::Mistake::*;
    match m {
        LossKeptWithGraph => "a loss (or metric) kept as a tensor with its graph",
        OutputsKeptInList => "outputs kept in a list with their graph",
        RetainedAcrossSteps => "tensors kept past their step",
        EvaluationBuildsGraph => "evaluation records an autograd graph",
        GradientsNeverCleared => "gradients never cleared",
        StateCarriedWithGraph => "a state carried across steps with its graph",
    }
}

/// How much a finding holds, in words.
pub fn finding_amount(f: &Finding) -> String {
    use headroom_memory::doctor::Mistake::*;
    match f.mistake {
        EvaluationBuildsGraph => format!("{} saved for backward", format_bytes(f.bytes)),
        GradientsNeverCleared => format!("{} of gradients", format_bytes(f.bytes)),
        _ => format!("{} per step in {} steps", format_bytes(f.bytes), f.steps),
    }
}

fn finding(n: usize, f: &Finding) -> String {
    let what = mistake_name(f.mistake);
    let amount = finding_amount(f);
    let mut s = format!("  {n}. {what}: {amount}\n     made at {}", frame(&f.frame));
    if let Some(code) = &f.code {
        s += &format!("  `{code}`");
    }
    s.push('\n');
    if let (Some((line, code)), Some(fr)) = (&f.kept_at, &f.frame) {
        s += &format!("     kept at {}:{line}  `{code}`\n", fr.filename);
    }
    s += &format!("     fix: {}\n", f.fix);
    s
}

/// The text of the side JSON's run: the levers, and what does not match the trace.
pub fn render_run(run: &RunReport) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let l = &run.levers;
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Levers for {} on {} ({} usable): the stated strategy needs {}{}",
        run.model,
        run.device,
        format_bytes(l.usable_bytes),
        format_bytes(l.stated_peak_bytes),
        if l.stated_fits {
            ", and fits"
        } else {
            ", and does not fit"
        }
    );
    let _ = writeln!(
        o,
        "  each alone, cheapest first (Hugging Face's single-GPU guide's order):"
    );
    for (i, lever) in l.levers.iter().enumerate() {
        let first = if l.first_fit == Some(i) {
            "  <- first that fits"
        } else {
            ""
        };
        match (lever.peak_bytes, lever.saving_bytes) {
            (Some(peak), Some(saving)) => {
                let _ = writeln!(
                    o,
                    "  {}. {:<38} {:>10} peak, saves {:>10}  {}  {}{first}",
                    i + 1,
                    lever.lever.name(),
                    format_bytes(peak),
                    signed_bytes(saving),
                    if lever.fits { "fits" } else { "does not fit" },
                    lever.change
                );
            }
            _ => {
                let _ = writeln!(
                    o,
                    "  {}. {:<38} does not apply: {}",
                    i + 1,
                    lever.lever.name(),
                    lever.change
                );
            }
        }
    }
    if l.first_fit.is_none() {
        let _ = writeln!(
            o,
            "  no lever fits alone: combine them (headroom plan searches the combinations)"
        );
    }
    if !run.mismatches.is_empty() {
        let _ = writeln!(o, "  side JSON against the trace:");
        for m in &run.mismatches {
            let _ = writeln!(o, "  - {m}");
        }
    }
    o
}

/// Bytes saved, negative when a lever needs more.
pub fn signed_bytes(b: i64) -> String {
    match b < 0 {
        true => format!("-{}", format_bytes(b.unsigned_abs())),
        false => format_bytes(b as u64),
    }
}
