//! The files of a `headroom train` run: their paths checked before any work, then the
//! timeline, the snapshot and the JSON report written (and the text report printed) after it.
//!
//! Not for: drawing or rendering them (`crate::report`).

use super::train::TrainArgs;
use crate::report::timeline::write_timeline_svg;
use crate::report::train_report::print_report;
use anyhow::Context;
use headroom_memory::Snapshot;
use headroom_memory::output::{check_writable, write_output};
use headroom_memory::timeline::timeline;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::launch::RunOutcome;

/// Refuses, before any work, output paths that cannot be written: the JSON report, the
/// timeline, the snapshot and the save directory.
pub(super) fn check_outputs(args: &TrainArgs, keys: &TrainConfig) -> anyhow::Result<()> {
    let timeline = (!args.no_timeline).then_some(&args.timeline);
    for (flag, path) in [
        ("--json-report", args.json_report.as_ref()),
        ("--timeline", timeline),
        ("--snapshot", args.snapshot.as_ref()),
    ] {
        if let Some(path) = path {
            check_writable(path)
                .with_context(|| format!("{flag} {} cannot be written", path.display()))?;
        }
    }
    if let Some(dir) = &keys.save_dir {
        std::fs::create_dir_all(dir)
            .and_then(|()| check_writable(&dir.join("latest")))
            .with_context(|| format!("--save-dir {} cannot be written", dir.display()))?;
    }
    Ok(())
}

/// The timeline picture, the snapshot and the JSON report (files first, so a closed stdout
/// cannot lose them), then the text report. A file that cannot be written (a full disk) does
/// not cost the others or the text report: each is tried, the report is printed, and then the
/// failures are returned together.
pub(super) fn write_outputs(
    args: &TrainArgs,
    outcome: &RunOutcome,
    config: &RunConfig,
) -> anyhow::Result<()> {
    let (report, device) = (&outcome.report, &outcome.device);
    let timeline_path = (!args.no_timeline).then_some(&args.timeline);
    let mut failures: Vec<anyhow::Error> = Vec::new();
    if let Some(path) = timeline_path {
        let series = timeline(device.lock().trace().entries(), 2000);
        let title = format!(
            "headroom train: {} ({}), device memory by category",
            outcome.model, config.strategy.precision
        );
        if let Err(e) = write_timeline_svg(&series, Some(config.device_memory), &title, path) {
            failures.push(e);
        }
    }
    if let Some(path) = &args.snapshot {
        let written = Snapshot::capture(&device.lock()).write_pickle(path);
        if let Err(e) = written {
            failures
                .push(anyhow::Error::new(e).context(format!("cannot write {}", path.display())));
        }
    }
    if let Some(path) = &args.json_report {
        let written = serde_json::to_vec_pretty(report)
            .map_err(anyhow::Error::new)
            .and_then(|json| write_output(path, &json).map_err(anyhow::Error::new));
        match written {
            Ok(()) => eprintln!("JSON report written to {}", path.display()),
            Err(e) => failures.push(e.context(format!("cannot write {}", path.display()))),
        }
    }
    print_report(report, device, timeline_path.map(|p| p.as_path()));
    match failures.len() {
        0 => Ok(()),
        1 => Err(failures.remove(0)),
        n => {
            let all: Vec<String> = failures.iter().map(|e| format!("{e:#}")).collect();
            anyhow::bail!("{n} outputs could not be written: {}", all.join("; "))
        }
    }
}
