//! `headroom memory …`: the allocator's observability on traces — replay a headroom JSON trace
//! or a PyTorch memory snapshot through the caching or the expandable allocator and read the
//! summary, the fragmentation figures and PyTorch's statistics.

use crate::report::timeline::write_timeline_svg;
use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use headroom_memory::replay::{ReplayOutcome, parse_trace, replay, replay_planned};
use headroom_memory::size::{ByteSize, format_bytes};
use headroom_memory::timeline::timeline;
use headroom_memory::{
    AllocatorConfig, CachingAllocator, Fragmentation, Snapshot, VirtualSource, memory_summary,
};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Replay an allocation trace through the allocator and print its summary and fragmentation.
    ///
    /// TRACE is headroom's JSON trace — an array of {"action": "alloc" | "free", "addr": <id>,
    /// "size": <bytes>} ("size" may be omitted on free; an optional "category" tags the bytes) —
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
        MemoryCommand::Replay(args) => run_replay(args),
        MemoryCommand::Doctor(args) => crate::commands::doctor::run(args),
    }
}

fn run_replay(args: ReplayArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.trace)
        .with_context(|| format!("cannot read trace file {}", args.trace.display()))?;
    let trace = parse_trace(&bytes)
        .with_context(|| format!("{} is not a replayable trace", args.trace.display()))?;
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
    if let Some(path) = &args.snapshot {
        Snapshot::capture(&allocator)
            .write_pickle(path)
            .with_context(|| format!("cannot write snapshot {}", path.display()))?;
    }
    if let Some(path) = &args.timeline {
        let series = timeline(allocator.trace().entries(), 2000);
        let title = format!(
            "{} through the {} allocator",
            args.trace.file_name().map_or_else(
                || args.trace.display().to_string(),
                |n| n.to_string_lossy().into_owned()
            ),
            kind_name(args.allocator)
        );
        write_timeline_svg(&series, args.capacity.map(|c| c.0), &title, path)?;
    }
    let fragmentation = Fragmentation::of(&allocator);
    if args.json {
        let report = serde_json::json!({
            "trace": args.trace.display().to_string(),
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
            "stats": allocator.stats().flat(),
            "fragmentation": fragmentation,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_text(
        &args,
        &allocator,
        &outcome,
        &fragmentation,
        trace.events.len(),
    );
    Ok(())
}

fn kind_name(kind: AllocatorKind) -> &'static str {
    match kind {
        AllocatorKind::Caching => "caching",
        AllocatorKind::Expandable => "expandable-segments",
        AllocatorKind::Planned => "planned-arena",
    }
}

fn print_text(
    args: &ReplayArgs,
    a: &CachingAllocator,
    outcome: &ReplayOutcome,
    f: &Fragmentation,
    events: usize,
) {
    let s = a.stats();
    let capacity = match args.capacity {
        Some(c) => format!("{} ({} bytes)", format_bytes(c.0), c.0),
        None => "unlimited".to_string(),
    };
    println!(
        "Replayed {events} events of {} through the {} allocator, capacity {capacity}.",
        args.trace.display(),
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
    println!();
    print!("{}", memory_summary(a));
}
