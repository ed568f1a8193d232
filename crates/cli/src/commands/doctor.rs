//! `headroom memory doctor`: a real run's trace explained — the peak attributed to phase,
//! category and call site, allocations kept across steps with the mistake they look like and
//! its fix, and fragmentation answered by replay — as text for people or JSON for machines.
//!
//! Not for: the analyses themselves (`headroom_memory::doctor`).

use anyhow::{Context, bail};
use clap::Args;
use headroom_memory::AllocatorConfig;
use headroom_memory::doctor::{Diagnosis, DoctorOptions, Finding, Frame, ReplayFigures, diagnose};
use headroom_memory::size::{ByteSize, format_bytes};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The trace: a PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot, recorded
    /// with _record_memory_history(stacks="python") for call sites) or headroom's JSON trace
    pub trace: PathBuf,
    /// Device capacity for the out-of-memory replays (e.g. 24GiB, 80GB); without it no
    /// out-of-memory is replayed
    #[arg(long)]
    pub capacity: Option<ByteSize>,
    /// The run's allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax (e.g. "max_split_size_mb:128")
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// How many call sites to list at the peak
    #[arg(long, default_value_t = 8)]
    pub sites: usize,
    /// Where the trace's source files are, when not at the paths it records (the leak check
    /// reads the lines that made and kept the tensors)
    #[arg(long)]
    pub source_root: Option<PathBuf>,
    /// Print one JSON object instead of the text report
    #[arg(long)]
    pub json: bool,
}

/// The largest source file read for its lines.
const MAX_SOURCE_BYTES: u64 = 4 << 20;

/// Reads the user's source files once each, by the paths the trace records (joined to `root`
/// when given); Python files only.
struct SourceFiles {
    root: Option<PathBuf>,
    files: RefCell<HashMap<String, Option<Vec<String>>>>,
}

impl SourceFiles {
    fn line(&self, file: &str, line: i64) -> Option<String> {
        if !file.ends_with(".py") || line < 1 {
            return None;
        }
        let mut files = self.files.borrow_mut();
        let lines = files.entry(file.to_string()).or_insert_with(|| {
            let path = match &self.root {
                Some(root) => root.join(Path::new(file).file_name()?),
                None => PathBuf::from(file),
            };
            let meta = std::fs::metadata(&path).ok()?;
            if !meta.is_file() || meta.len() > MAX_SOURCE_BYTES {
                return None;
            }
            let text = std::fs::read_to_string(&path).ok()?;
            Some(text.lines().map(str::to_string).collect())
        });
        lines.as_ref()?.get(line as usize - 1).cloned()
    }
}

pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.trace)
        .with_context(|| format!("cannot read trace file {}", args.trace.display()))?;
    let events = headroom_memory::doctor::read_trace(&bytes).with_context(|| {
        format!(
            "{} is not a trace the doctor can read",
            args.trace.display()
        )
    })?;
    if args.capacity.is_some_and(|c| c.0 == 0) {
        bail!("--capacity must be more than 0 bytes");
    }
    let allocator = match &args.alloc_conf {
        Some(text) => AllocatorConfig::parse(text)?,
        None => AllocatorConfig::default(),
    };
    let files = SourceFiles {
        root: args.source_root.clone(),
        files: RefCell::new(HashMap::new()),
    };
    let source = |file: &str, line: i64| files.line(file, line);
    let d = diagnose(
        &events,
        &DoctorOptions {
            capacity: args.capacity.map(|c| c.0),
            allocator,
            sites: args.sites,
            source: &source,
        },
    );
    if args.json {
        crate::json_out::print_json(&serde_json::to_value(&d)?)?;
    } else {
        print!("{}", render(&args.trace, &d));
    }
    Ok(())
}

fn frame(f: &Option<Frame>) -> String {
    match f {
        Some(f) => format!("{}:{} ({})", f.filename, f.line, f.name),
        None => "no Python frame (autograd's backward thread)".into(),
    }
}

fn share(part: u64, whole: u64) -> String {
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
    let fr = &d.fragmentation;
    let capacity = fr.capacity_bytes.map_or("no capacity given".into(), |c| {
        format!("capacity {}", format_bytes(c))
    });
    let _ = writeln!(
        o,
        "Fragmentation (replayed through the caching allocator, {capacity}):"
    );
    let c = &fr.caching;
    let _ = writeln!(
        o,
        "  peak reserved {} for {} allocated ({:.2}×); at the peak {} cached and unused, {} of it not releasable by empty_cache",
        format_bytes(c.peak_reserved_bytes),
        format_bytes(c.peak_allocated_bytes),
        c.fragmentation.peak_reserved_over_allocated,
        format_bytes(c.fragmentation.cached_unallocated_bytes),
        format_bytes(c.fragmentation.non_releasable_bytes)
    );
    match &c.first_oom {
        None if fr.capacity_bytes.is_some() => {
            let _ = writeln!(o, "  no out-of-memory at this capacity");
        }
        None => {}
        Some(oom) => {
            let phase = oom
                .phase
                .map_or("phase unknown".into(), |p| p.name().to_string());
            let _ = writeln!(
                o,
                "  out of memory at event {} ({phase}): {} requested with {} allocated and {} reserved; the largest free block was {}",
                oom.event_index,
                format_bytes(oom.requested_bytes),
                format_bytes(oom.allocated_bytes),
                format_bytes(oom.reserved_bytes),
                format_bytes(oom.largest_free_block_bytes)
            );
            let _ = writeln!(
                o,
                "  {}",
                if oom.fragmentation_bound {
                    "the bytes existed, not in one piece: fragmentation"
                } else {
                    "the bytes themselves were missing: fragmentation is not the cause"
                }
            );
            let _ = writeln!(
                o,
                "  with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): {}",
                outcome(&fr.expandable)
            );
            if let Some(e) = &fr.emptied_before_failing_phase {
                let _ = writeln!(
                    o,
                    "  with torch.cuda.empty_cache() when that phase began: {}",
                    outcome(e)
                );
            }
        }
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

fn outcome(r: &ReplayFigures) -> String {
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

fn finding(n: usize, f: &Finding) -> String {
    use headroom_memory::doctor::Mistake::*;
    let what = match f.mistake {
        LossKeptWithGraph => "a loss (or metric) kept as a tensor with its graph",
        OutputsKeptInList => "outputs kept in a list with their graph",
        RetainedAcrossSteps => "tensors kept past their step",
        EvaluationBuildsGraph => "evaluation records an autograd graph",
        GradientsNeverCleared => "gradients never cleared",
        StateCarriedWithGraph => "a state carried across steps with its graph",
    };
    let amount = match f.mistake {
        EvaluationBuildsGraph => format!("{} saved for backward", format_bytes(f.bytes)),
        GradientsNeverCleared => format!("{} of gradients", format_bytes(f.bytes)),
        _ => format!("{} per step in {} steps", format_bytes(f.bytes), f.steps),
    };
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
