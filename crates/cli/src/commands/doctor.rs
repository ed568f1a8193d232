//! `headroom memory doctor`: a real run's trace explained — the peak attributed to phase,
//! category and call site, allocations kept across steps with the mistake they look like and
//! its fix, and fragmentation answered by replay — as text for people or JSON for machines: the
//! command, its inputs and the source lines it reads.
//!
//! Not for: the analyses themselves (`headroom_memory::doctor`) or the text report
//! (`doctor_text`).

use crate::commands::doctor_side::{RunReport, read_side, report};
use crate::commands::doctor_text::{render, render_run};
use anyhow::{Context, bail};
use clap::Args;
use headroom_memory::AllocatorConfig;
use headroom_memory::doctor::{Diagnosis, DoctorOptions, diagnose};
use headroom_memory::size::ByteSize;
use serde::Serialize;
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
    /// The run the trace came from (model, device, sequence length, batch split, strategy;
    /// docs/doctor.md): the levers are ranked for it, and what does not match the trace is said
    #[arg(long, value_name = "FILE")]
    pub side: Option<PathBuf>,
    /// Also write the diagnosis as one self-contained HTML page (inline CSS and SVG)
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Print one JSON object instead of the text report
    #[arg(long)]
    pub json: bool,
}

/// The whole report: the trace's diagnosis and, with a side JSON, the run's levers.
#[derive(Debug, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub diagnosis: Diagnosis,
    /// The side JSON's run (absent without `--side` or a recorded side).
    pub run: Option<RunReport>,
    /// The record `headroom.record` wrote beside the snapshot, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<serde_json::Value>,
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
    // A run `headroom.record` recorded carries its own side JSON beside the snapshot.
    let recorded = crate::commands::recorded::beside(&args.trace)?;
    let side = match (&args.side, &recorded) {
        (Some(path), _) => {
            Some(read_side(path).with_context(|| format!("--side {}", path.display()))?)
        }
        (None, Some(r)) => crate::commands::recorded::side(r)?,
        (None, None) => None,
    };
    if let Some(html) = &args.html {
        headroom_memory::output::check_writable(html)
            .with_context(|| format!("--html {}: cannot write there", html.display()))?;
    }
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
    // The side JSON's device is the replays' capacity unless --capacity says otherwise.
    let capacity = args
        .capacity
        .map(|c| c.0)
        .or(side.as_ref().map(|s| s.problem.hardware.gpu.memory_bytes));
    let diagnosis = diagnose(
        &events,
        &DoctorOptions {
            capacity,
            allocator,
            sites: args.sites,
            source: &source,
        },
    );
    let run = side
        .as_ref()
        .map(|s| report(s, &diagnosis, args.capacity.map(|c| c.0)));
    let r = Report {
        diagnosis,
        run,
        recorded: recorded.as_ref().map(|r| r.facts.clone()),
    };
    if let Some(html) = &args.html {
        let page = crate::commands::doctor_html::page(&args.trace, &r);
        headroom_memory::output::write_output(html, page.as_bytes())
            .with_context(|| format!("--html {}", html.display()))?;
    }
    if args.json {
        crate::json_out::print_json(&serde_json::to_value(&r)?)?;
    } else {
        if let Some(rec) = &recorded {
            println!("{}", crate::commands::recorded::text(rec));
        }
        print!("{}", render(&args.trace, &r.diagnosis));
        if let Some(run) = &r.run {
            print!("{}", render_run(run));
        }
    }
    Ok(())
}
