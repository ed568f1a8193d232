//! `headroom memory …`: the allocator's observability on traces — replay a headroom JSON trace
//! or a PyTorch memory snapshot through the caching or the expandable allocator and read the
//! summary, the fragmentation figures and PyTorch's statistics.

use crate::report::timeline::write_timeline_svg;
use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use headroom_memory::replay::{
    ReplayEvent, ReplayOutcome, Trace, parse_trace, replay, replay_planned,
};
use headroom_memory::size::{ByteSize, format_bytes};
use headroom_memory::timeline::timeline;
use headroom_memory::{
    AllocatorConfig, CachingAllocator, Fragmentation, Snapshot, VirtualSource, memory_summary,
};
use std::path::{Path, PathBuf};

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Replay an allocation trace through the allocator and print its summary and fragmentation.
    ///
    /// TRACE is headroom's JSON trace — an array of {"action": "alloc" | "free", "addr": <id>,
    /// "size": <bytes>} ("size" may be omitted on free; an optional "category" tags the bytes,
    /// and optional "phase", "step", "module", "op" and "dtype" label an allocation, as
    /// `headroom trace` writes them: the report names the allocation that set the peak) —
    /// or a PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot), whose
    /// device_traces are replayed. With --capacity, an allocation that cannot be served is
    /// reported as an OOM event and the replay continues. Run it once with each allocator to
    /// see whether expandable segments would have saved your run.
    Replay(ReplayArgs),
    /// Explain a run's memory from its trace: the peak by phase, category and call site, what is
    /// kept across steps and the mistake it looks like (a loss summed as a tensor, outputs kept in
    /// a list, evaluation without torch.no_grad, gradients never cleared) with its fix, and
    /// whether expandable segments or empty_cache would have avoided an out-of-memory (replayed).
    Doctor(crate::commands::doctor::DoctorArgs),
}

/// Which allocator mode to replay through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AllocatorKind {
    /// PyTorch's default caching allocator (fixed-size segments).
    Caching,
    /// Expandable segments: one growable range per pool.
    Expandable,
    /// A planned arena: the whole trace recorded once, packed by lifetimes, replayed from the
    /// plan (what is still live at the end goes to the caching pools).
    Planned,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The trace file: headroom JSON or a PyTorch snapshot pickle.
    pub trace: PathBuf,
    #[command(flatten)]
    pub options: ReplayOptions,
}

/// How a trace is replayed and reported (shared with `headroom trace`).
#[derive(Debug, Args)]
pub struct ReplayOptions {
    /// Allocator to replay through.
    #[arg(long, value_enum, default_value = "caching")]
    pub allocator: AllocatorKind,
    /// Device capacity (e.g. 16GiB, 80GB, 512MiB; GB = 10^9, GiB = 2^30). Unlimited if omitted.
    #[arg(long)]
    pub capacity: Option<ByteSize>,
    /// Extra allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, e.g. "max_split_size_mb:128".
    #[arg(long)]
    pub alloc_conf: Option<String>,
    /// Print one JSON object on stdout instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Also write the final allocator state and trace as a PyTorch snapshot pickle (opens in
    /// pytorch.org/memory_viz).
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<PathBuf>,
    /// Also draw the memory timeline (allocated bytes by category, reserved bytes, capacity,
    /// OOMs) as an SVG picture.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
}

/// Capacity used when none is given: large enough never to bind (1 TiB).
const UNLIMITED: u64 = 1 << 40;

pub fn run(cmd: MemoryCommand) -> anyhow::Result<()> {
    match cmd {
        MemoryCommand::Replay(args) => replay_file(&args.trace, &args.options),
        MemoryCommand::Doctor(args) => crate::commands::doctor::run(args),
    }
}

/// Replays the trace in `path` and prints the report `args` asks for.
pub fn replay_file(path: &Path, args: &ReplayOptions) -> anyhow::Result<()> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("cannot read trace file {}", path.display()))?;
    let trace = parse_trace(&bytes)
        .with_context(|| format!("{} is not a replayable trace", path.display()))?;
    let recorded = crate::commands::recorded::beside(path)?;
    let mut config = match &args.alloc_conf {
        Some(text) => AllocatorConfig::parse(text)?,
        None => AllocatorConfig::default(),
    };
    config.expandable_segments |= args.allocator == AllocatorKind::Expandable;
    let capacity = args.capacity.map_or(UNLIMITED, |c| c.0);
    if capacity == 0 {
        bail!("--capacity must be more than 0 bytes");
    }
    let mut allocator = CachingAllocator::new(capacity, config, Box::new(VirtualSource::default()));
    allocator.set_device_name("replay:0");
    if args.snapshot.is_some() || args.timeline.is_some() {
        allocator.trace_mut().record_history(true, usize::MAX);
    }
    let outcome = if args.allocator == AllocatorKind::Planned {
        replay_planned(&trace, &mut allocator)?
    } else {
        replay(&trace, &mut allocator)
    };
    if let Some(out) = &args.snapshot {
        Snapshot::capture(&allocator)
            .write_pickle(out)
            .with_context(|| format!("cannot write snapshot {}", out.display()))?;
    }
    if let Some(out) = &args.timeline {
        let series = timeline(allocator.trace().entries(), 2000);
        let title = format!(
            "{} through the {} allocator",
            path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned()
            ),
            kind_name(args.allocator)
        );
        write_timeline_svg(&series, args.capacity.map(|c| c.0), &title, out)?;
    }
    let fragmentation = Fragmentation::of(&allocator);
    if args.json {
        let report = serde_json::json!({
            "trace": path.display().to_string(),
            "format": trace.format,
            "allocator": match args.allocator {
                AllocatorKind::Caching => "caching",
                AllocatorKind::Expandable => "expandable",
                AllocatorKind::Planned => "planned",
            },
            "arena": allocator.arena_report(),
            "capacity_bytes": args.capacity.map(|c| c.0),
            "events": trace.events.len(),
            "outcome": outcome,
            "at_peak": at_peak(&trace, &outcome),
            "stats": allocator.stats().flat(),
            "fragmentation": fragmentation,
            "recorded": recorded.as_ref().map(|r| &r.facts),
        });
        crate::json_out::print_json(&report)?;
        return Ok(());
    }
    if let Some(r) = &recorded {
        println!("{}", crate::commands::recorded::text(r));
    }
    print_text(path, args, &allocator, &outcome, &fragmentation, &trace);
    Ok(())
}

/// The allocation that set the allocated peak: its event, bytes, category and labels (phase,
/// step, module, op, dtype) where the trace has them.
fn at_peak(trace: &Trace, outcome: &ReplayOutcome) -> serde_json::Value {
    let Some(index) = outcome.peak_event else {
        return serde_json::Value::Null;
    };
    let ReplayEvent::Alloc { size, category, .. } = trace.events[index] else {
        return serde_json::Value::Null;
    };
    let mut out = serde_json::json!({"event": index, "size": size, "category": category});
    if let Some(label) = trace.labels.of(index)
        && let (Some(fields), serde_json::Value::Object(labels)) =
            (out.as_object_mut(), serde_json::json!(label))
    {
        fields.extend(labels);
    }
    out
}

/// "in backward (step 1), module h.0.mlp, op aten::mm" for a labelled peak allocation.
fn peak_place(trace: &Trace, outcome: &ReplayOutcome) -> Option<String> {
    let label = trace.labels.of(outcome.peak_event?)?;
    let mut parts = Vec::new();
    if let Some(phase) = &label.phase {
        parts.push(match label.step {
            Some(step) => format!("in {phase} (step {step})"),
            None => format!("in {phase}"),
        });
    }
    if let Some(module) = label.module.as_deref().filter(|m| !m.is_empty()) {
        parts.push(format!("module {module}"));
    }
    if let Some(op) = &label.op {
        parts.push(format!("op {op}"));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn kind_name(kind: AllocatorKind) -> &'static str {
    match kind {
        AllocatorKind::Caching => "caching",
        AllocatorKind::Expandable => "expandable-segments",
        AllocatorKind::Planned => "planned-arena",
    }
}

fn print_text(
    path: &Path,
    args: &ReplayOptions,
    a: &CachingAllocator,
    outcome: &ReplayOutcome,
    f: &Fragmentation,
    trace: &Trace,
) {
    let events = trace.events.len();
    let s = a.stats();
    let capacity = match args.capacity {
        Some(c) => format!("{} ({} bytes)", format_bytes(c.0), c.0),
        None => "unlimited".to_string(),
    };
    println!(
        "Replayed {events} events of {} through the {} allocator, capacity {capacity}.",
        path.display(),
        kind_name(args.allocator),
    );
    println!(
        "{} allocations, {} frees, {} out-of-memory events.",
        outcome.allocs,
        outcome.frees,
        outcome.ooms.len()
    );
    for oom in outcome.ooms.iter().take(5) {
        println!(
            "  OOM at event {}: {} requested",
            oom.event_index,
            format_bytes(oom.size)
        );
    }
    if outcome.ooms.len() > 5 {
        println!("  … and {} more", outcome.ooms.len() - 5);
    }
    println!(
        "Peak allocated {}, peak reserved {} (ratio {:.3}).",
        format_bytes(s.allocated_bytes.all.peak as u64),
        format_bytes(s.reserved_bytes.all.peak as u64),
        f.peak_reserved_over_allocated
    );
    if let Some(place) = peak_place(trace, outcome) {
        println!("The allocated peak is reached {place}.");
    }
    println!();
    print!("{}", memory_summary(a));
}
