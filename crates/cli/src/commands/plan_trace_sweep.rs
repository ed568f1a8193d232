//! The traces behind `headroom plan --trace`: the settings written as a sweep spec, one Python
//! process (`python -m headroom.trace.sweep`) tracing them all into a temporary directory, and
//! each trace replayed through the caching allocator for its allocated and reserved peaks.
//!
//! Not for: which settings to trace (`plan_trace_variants`) or how to rank them (`plan_trace`).

use super::trace::tracer_python;
use anyhow::{Context, Result, bail};
use headroom_memory::replay::{parse_trace, replay};
use headroom_memory::{AllocatorConfig, CachingAllocator, VirtualSource};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Per setting (`headroom.trace` keyword arguments; `seq_len` overrides the sweep's), the
/// (allocated, reserved) peaks of its replayed trace, or the tracer's message when it could not
/// be traced.
pub fn trace_peaks(
    model: &str,
    seq_len: u64,
    steps: u64,
    settings: &[serde_json::Value],
) -> Result<Vec<Result<(u64, u64), String>>> {
    let python = tracer_python()?;
    let dir = TraceDir::new()?;
    let spec_path = dir.path().join("sweep.json");
    let sweep = serde_json::json!({
        "model": model,
        "seq_len": seq_len,
        "steps": steps,
        "output_dir": dir.path(),
        "variants": settings,
    });
    std::fs::write(&spec_path, serde_json::to_vec(&sweep)?)
        .with_context(|| format!("cannot write {}", spec_path.display()))?;
    let out = Command::new(&python)
        .args(["-m", "headroom.trace.sweep"])
        .arg(&spec_path)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run Python '{python}'"))?;
    if !out.status.success() {
        bail!("the tracer failed (its message is above); nothing was planned");
    }
    let results: SweepOutput = serde_json::from_slice(&out.stdout).context(
        "the tracer's sweep printed no result; run it again with HEADROOM_PYTHON set to the interpreter that has torch",
    )?;
    if results.variants.len() != settings.len() {
        bail!(
            "the tracer returned {} results for {} settings",
            results.variants.len(),
            settings.len()
        );
    }
    results
        .variants
        .into_iter()
        .map(|r| match (r.trace, r.error) {
            (Some(path), _) => Ok(Ok(replay_peaks(&path)?)),
            (None, Some(e)) => Ok(Err(e)),
            (None, None) => Ok(Err("the tracer wrote no trace".to_string())),
        })
        .collect()
}

/// The directory the traces are written to, removed with everything in it when dropped.
struct TraceDir(PathBuf);

impl TraceDir {
    fn new() -> Result<TraceDir> {
        let path = std::env::temp_dir().join(format!("headroom-plan-trace-{}", std::process::id()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot make {} for the traces", path.display()))?;
        Ok(TraceDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TraceDir {
    fn drop(&mut self) {
        // Best effort: a leftover directory in the temporary folder harms nothing.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Deserialize)]
struct SweepResult {
    trace: Option<PathBuf>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct SweepOutput {
    variants: Vec<SweepResult>,
}

/// The allocated and reserved peaks of a trace replayed through the caching allocator with no
/// capacity limit.
fn replay_peaks(path: &Path) -> Result<(u64, u64)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let trace = parse_trace(&bytes)
        .with_context(|| format!("{} is not a replayable trace", path.display()))?;
    let mut allocator = CachingAllocator::new(
        1 << 50,
        AllocatorConfig::default(),
        Box::new(VirtualSource::default()),
    );
    replay(&trace, &mut allocator);
    let s = allocator.stats();
    Ok((
        s.allocated_bytes.all.peak.max(0) as u64,
        s.reserved_bytes.all.peak.max(0) as u64,
    ))
}
