//! `headroom train`: trains a model on headroom's engine inside a device budget and reports
//! where every byte went. With no arguments it runs the embedded default (a small GPT on the
//! bundled corpus); every lever is a flag or a key of `--config FILE` (flags win).

use super::plan_output::group_digits;
use super::train_group::mpi_rank;
use crate::report::progress::Progress;
use crate::report::timeline::write_timeline_svg;
use crate::report::train_report::print_report;
use crate::signals::{Interrupted, StopSignals, name};
use anyhow::{Context, bail};
use clap::Args;
use headroom_memory::Snapshot;
use headroom_memory::output::{check_writable, write_output};
use headroom_memory::size::format_bytes;
use headroom_memory::timeline::timeline;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::data::token_file::is_token_file;
use headroom_train::launch::{
    LaunchError, LaunchEvent, LaunchOptions, Observer, RunOutcome, Stopped, launch,
};
use headroom_train::predict::Prediction;
use headroom_train::prepare::{PrepareError, PrepareOptions, prepare};
use headroom_train::recompute::policy::BudgetDecision;
use headroom_train::save;
use headroom_train::strategy::Pins;
use headroom_train::{TrainError, Trainer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// A TOML file with any of the keys below (as `headroom plan --emit headroom` writes);
    /// flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub keys: TrainConfig,
    /// Before training, find the largest micro-batch that fits the device budget (by dry runs
    /// on the real allocator, no trial steps) and train with it.
    #[arg(long, conflicts_with_all = ["auto", "resume"])]
    pub find_batch_size: bool,
    /// Choose the fastest strategy that fits --device-memory: precision, optimizer state,
    /// checkpointing, attention and micro-batch × accumulation (same effective batch), by dry
    /// runs and a measured speed model. Levers given as flags or in --config are kept. This is
    /// the default when none of them is given.
    #[arg(long, conflicts_with_all = ["no_auto", "resume"])]
    pub auto: bool,
    /// Run exactly the configured strategy (defaults included) instead of choosing one.
    #[arg(long)]
    pub no_auto: bool,
    /// Continue a saved run from its directory (or its step-NNNNNN folder), bit-exactly, with
    /// the strategy it was saved with (an --auto choice included). Flags given with it may
    /// change only what keeps the run's numbers: the split of the same effective batch, the
    /// checkpoint policy, attention, budget, steps, schedule, evaluation and saving; each change
    /// is reported. Saves keep going to the resumed directory unless --save-dir says otherwise.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Write the run's figures as one JSON object.
    #[arg(long, value_name = "FILE")]
    pub json_report: Option<PathBuf>,
    /// Where to draw the memory timeline (SVG).
    #[arg(long, value_name = "FILE", default_value = "headroom-timeline.svg")]
    pub timeline: PathBuf,
    /// Do not draw the memory timeline.
    #[arg(long)]
    pub no_timeline: bool,
    /// Also write the allocator's state and trace as a PyTorch memory snapshot.
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<PathBuf>,
}

/// Trace entries kept for the timeline and snapshot (oldest dropped beyond this).
const TRACE_ENTRIES: usize = 2_000_000;
/// The largest micro-batch `--find-batch-size` tries.
const MAX_MICRO_BATCH: usize = 4096;

pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    // From here on, SIGINT/SIGTERM/SIGHUP stop the run after a step and save it.
    let signals = StopSignals::install().context("cannot install signal handlers")?;
    let file = match &args.config {
        Some(path) => TrainConfig::from_file(path)?,
        None => TrainConfig::default(),
    };
    let merged = file.overridden_by(args.keys.clone());
    // Under mpirun this process is one rank of the job (the `mpi` build).
    let mpi = mpi_rank(&merged)?;
    let lead = mpi.as_ref().is_none_or(|c| c.rank() == 0);
    check_outputs(&args, &merged)?;
    if args.resume.is_some() && merged.init_from.is_some() {
        bail!(
            "--init-from and --resume both give the run's weights: --resume continues a saved run (weights, optimizer state, data position), --init-from starts a new one from a save's weights; give one"
        );
    }
    let job = mpi.as_ref().map(|c| c.world_size());
    let (config, pins, options) = configure(&args, merged, job, lead)?;
    let corpus = match &config.data {
        // A prepared token file is memory-mapped by the loader, never read whole.
        Some(path) if is_token_file(path) => Corpus::prepared(path),
        Some(path) => Corpus::from_file(path)?,
        None => Corpus::bundled(),
    };
    let prepared = prepare(config, &corpus, &pins, options).map_err(explain_prepare)?;
    let config = prepared.config.clone();
    if lead {
        if let Some(choice) = &prepared.auto {
            eprintln!("auto: {}", choice.reason);
        }
        if let Some(m) = prepared.found_micro_batch {
            eprintln!(
                "--find-batch-size: the largest micro-batch that fits {} is {m} (dry runs)",
                format_bytes(config.device_memory)
            );
        }
        let recovers = config.oom_recovery && !config.strategy.optimizer_in_backward;
        print_prediction(&prepared.prediction, &config, recovers);
    }
    refuse_beyond_host(&prepared.prediction)?;
    // mpirun ends its ranks a second after it passes a stop on to them (SIGKILL follows its
    // SIGTERM): there, rank 0 says how to continue as soon as the save is made.
    let early_hint = job.map(|_| signals.clone());
    let observer = lead_observer(&config, &corpus.name, early_hint);
    let options = LaunchOptions {
        resume: args.resume.clone(),
        stop: Some(signals.requested.clone()),
        // A fault injected on purpose (tests of how a group ends): HEADROOM_FAULT=RANK:KIND@STEP.
        fault: std::env::var("HEADROOM_FAULT").ok(),
        trace_entries: TRACE_ENTRIES,
        process_rank: mpi,
        observer: Some(observer),
    };
    let outcome = launch(&prepared, Arc::new(corpus), options).map_err(explain_launch)?;
    let interrupted = outcome.stopped.as_ref().zip(signals.received());
    if outcome.lead {
        write_outputs(&args, &outcome, &config)?;
        if let Some((stopped, signal)) = interrupted.filter(|_| job.is_none()) {
            print_resume_hint(signal, stopped, config.steps);
        }
    }
    if let Some((_, signal)) = interrupted {
        return Err(Interrupted { signal }.into());
    }
    Ok(())
}

/// The configuration the run starts from, the levers given (which `--auto` keeps) and what
/// preparing it decides. `job`: the size of the `mpirun` job this process is a rank of, which
/// is the run's number of ranks, applied before a resumed run's checks so that they refuse or
/// re-split its effective batch exactly as for `--data-parallel`; `lead`: whether this process
/// speaks for the job.
fn configure(
    args: &TrainArgs,
    merged: TrainConfig,
    job: Option<usize>,
    lead: bool,
) -> anyhow::Result<(RunConfig, Pins, PrepareOptions)> {
    let mut merged = merged;
    // The job's ranks split the model when --tensor-parallel says so (its size must be the
    // job's, else the launch names both), and are data-parallel replicas otherwise.
    if let Some(n) = job.filter(|_| merged.tensor_parallel.is_none()) {
        merged.data_parallel = Some(n);
    }
    if let Some(dir) = &args.resume {
        // The saved run's weights replace whatever it started from.
        let mut c = resumed_config(dir, &merged)?;
        c.init_from = None;
        return Ok((c, Pins::default(), PrepareOptions::default()));
    }
    let pins = merged.pins();
    let auto_by_default = !args.no_auto && !pins.any() && !args.find_batch_size;
    let mut auto = args.auto || auto_by_default;
    if let Some(n) = merged.tensor_parallel {
        if args.auto {
            bail!(
                "--auto with --tensor-parallel {n}: the search plans whole or data-parallel runs, not split ones; give the levers (or --no-auto)"
            );
        }
        // A split run keeps its levers: the search would choose ZeRO or offload, which it refuses.
        auto = false;
    }
    if let Some(n) = job {
        if args.auto {
            bail!(
                "--auto under mpirun -n {n}: the search times kernels on the machine it runs on, so each rank could choose a different strategy; choose it in one process (headroom train --auto, or headroom plan --emit headroom), then give the chosen levers or --config to the mpirun job"
            );
        }
        if auto_by_default && lead && merged.tensor_parallel.is_none() {
            eprintln!(
                "auto: not under mpirun (each rank would time kernels on its own machine and could choose differently): the configured strategy runs as is; give --no-auto to say so, or choose one with headroom train --auto in one process"
            );
        }
        auto = false;
    }
    let options = PrepareOptions {
        auto,
        find_batch_size: args.find_batch_size.then_some(MAX_MICRO_BATCH),
    };
    Ok((merged.resolve()?, pins, options))
}

/// How a run stopped by `signal` and saved continues.
fn print_resume_hint(signal: i32, stopped: &Stopped, steps: u64) {
    eprintln!(
        "{} after step {} of {steps}: saved to {}; continue with: headroom train --resume {}",
        name(signal),
        stopped.step,
        stopped.save.display(),
        stopped.root.display()
    );
}

/// Rank 0's progress: how a `budget:SIZE` checkpoint policy was met, what runs, then a bar or
/// lines as it trains; with `hint_on_save`, how to continue as soon as a stopped run is saved.
fn lead_observer(config: &RunConfig, corpus: &str, hint_on_save: Option<StopSignals>) -> Observer {
    let (config, corpus) = (config.clone(), corpus.to_string());
    let progress = Mutex::new(None::<Progress>);
    Arc::new(move |event| match event {
        LaunchEvent::Ready(trainer) => {
            if let Some(d) = trainer.budget_decision() {
                print_budget_decision(d, trainer.model().depth());
            }
            print_start(trainer, &config, &corpus);
            *lock(&progress) = Some(Progress::new(config.steps, trainer.step(), true));
        }
        LaunchEvent::Train(event) => {
            if let Some(p) = lock(&progress).as_ref() {
                p.event(event);
            }
        }
        LaunchEvent::Trained => {
            if let Some(p) = lock(&progress).take() {
                p.finish();
            }
        }
        LaunchEvent::Stopped(stopped) => {
            if let Some(signal) = hint_on_save.as_ref().and_then(StopSignals::received) {
                print_resume_hint(signal, stopped, config.steps);
            }
        }
    })
}

/// The progress display, whichever thread last held it (drawing cannot leave it half-updated).
fn lock(progress: &Mutex<Option<Progress>>) -> std::sync::MutexGuard<'_, Option<Progress>> {
    progress
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The line that says what runs: model, parameters, precision, data, split, steps and budget.
fn print_start(trainer: &Trainer, config: &RunConfig, corpus: &str) {
    eprintln!(
        "headroom train: {} ({}), {} on {}, micro-batch {} × accumulation {}{} × {} tokens, {} steps, device budget {}{}",
        trainer.model().name(),
        describe_parameters(trainer, config.lora.as_ref()),
        config.strategy.precision,
        corpus,
        config.micro_batch(),
        config.accumulation(),
        match (config.data_parallel, config.tensor_parallel) {
            (_, Some(n)) => format!(" on a mesh of tp {n} × dp 1 (the model split over {n} ranks)"),
            (1, None) => String::new(),
            (n, None) => format!(" × {n} ranks"),
        },
        trainer.seq_len(),
        config.steps,
        format_bytes(config.device_memory),
        if config.ranks() > 1 { " per rank" } else { "" },
    );
}

/// The CPU backend's device memory is host memory: a run predicted to reserve more than the
/// host has available would exhaust the machine, so it is refused before it starts.
fn refuse_beyond_host(prediction: &Prediction) -> anyhow::Result<()> {
    let needed = prediction.memory.peak_reserved_bytes;
    match headroom_memory::host::available_bytes() {
        Some(available) if needed > available => anyhow::bail!(
            "the dry run predicts {} of device memory, more than the {} this machine has available; lower --device-memory, --micro-batch or the model's size, or checkpoint activations",
            format_bytes(needed),
            format_bytes(available)
        ),
        _ => Ok(()),
    }
}

/// Refuses, before any work, output paths that cannot be written: the JSON report, the
/// timeline, the snapshot and the save directory.
fn check_outputs(args: &TrainArgs, keys: &TrainConfig) -> anyhow::Result<()> {
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

/// The configuration a resumed run continues with: the saved one, changed only where `keys`
/// (file and flags) soundly may, each change printed; saves go on into the resumed directory
/// unless a save directory is given.
fn resumed_config(dir: &Path, keys: &TrainConfig) -> anyhow::Result<RunConfig> {
    let (manifest, save) = save::read_manifest(dir)?;
    let saved: RunConfig = serde_json::from_value(manifest.config).with_context(|| {
        format!(
            "{}: the saved configuration cannot be read",
            save.join("manifest.json").display()
        )
    })?;
    let (mut config, changes) = saved.resumed_with(keys)?;
    if keys.save_dir.is_none() {
        config.save_dir = Some(save::root_of(&save));
    }
    eprintln!(
        "resume: step {} of {} with the saved strategy ({})",
        manifest.step,
        save.display(),
        config.strategy.describe(true)
    );
    for change in &changes {
        eprintln!("resume: changed {change}");
    }
    Ok(config)
}

/// The dry run's prediction for the run about to start; `recovers`: whether the trainer retries
/// a step that runs out of memory. A run whose live peak fits but whose reserved peak does not
/// is told that the planned arena reserves only the live peak.
fn print_prediction(prediction: &Prediction, config: &RunConfig, recovers: bool) {
    let budget = config.device_memory;
    let arena = if !prediction.fits
        && config.allocator != headroom_memory::AllocatorKind::Planned
        && prediction.memory.peak_allocated_bytes <= budget
    {
        "; its live peak fits: --allocator planned reserves only that"
    } else {
        ""
    };
    eprintln!(
        "dry run: predicted peak {} allocated, {} reserved of the {} budget ({}{arena}; {:.0} ms)",
        format_bytes(prediction.memory.peak_allocated_bytes),
        format_bytes(prediction.memory.peak_reserved_bytes),
        format_bytes(budget),
        match (prediction.fits, recovers) {
            (true, _) => "fits",
            (false, true) => "does not fit: expect out-of-memory recovery",
            (false, false) => "does not fit: expect an out-of-memory error",
        },
        prediction.seconds * 1e3
    );
}

/// The timeline picture, the snapshot and the JSON report (files first, so a closed stdout
/// cannot lose them), then the text report. A file that cannot be written (a full disk) does
/// not cost the others or the text report: each is tried, the report is printed, and then the
/// failures are returned together.
fn write_outputs(args: &TrainArgs, outcome: &RunOutcome, config: &RunConfig) -> anyhow::Result<()> {
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

/// How `budget:SIZE` was met, next to Chen et al.'s planner.
fn print_budget_decision(d: &BudgetDecision, depth: usize) {
    let (plan, cost, peak) = &d.optimal;
    eprintln!(
        "checkpoint budget {}: {} segments recomputing {} of {depth} blocks (activation peak {} in a dry run){}",
        format_bytes(d.budget),
        plan.segments.len(),
        cost.recompute,
        format_bytes(*peak),
        match &d.chen {
            Some((_, c, p)) => format!(
                "; Chen et al.'s planner: {} blocks, peak {}",
                c.recompute,
                format_bytes(*p)
            ),
            None => "; Chen et al.'s planner finds no plan within it".to_string(),
        }
    );
}

/// Adds the fix to errors a user can act on.
fn explain(e: TrainError) -> anyhow::Error {
    match e {
        TrainError::OutOfMemory(oom) => anyhow::anyhow!(
            "{oom}\nThe run needs more than the device budget of {}: raise --device-memory, or lower --micro-batch (raising --accumulation keeps the effective batch, where the optimizer step does not run in backward).",
            format_bytes(oom.capacity)
        ),
        other => anyhow::Error::new(other),
    }
}

/// A launch's error, explained as [`explain`] does, naming the rank it happened on.
fn explain_launch(e: LaunchError) -> anyhow::Error {
    match e {
        LaunchError::Train(e) => explain(*e),
        LaunchError::Rank { rank, source } => explain(*source).context(format!("rank {rank}")),
        other => anyhow::Error::new(other),
    }
}

fn explain_prepare(e: PrepareError) -> anyhow::Error {
    match e {
        PrepareError::Train(e) => explain(e),
        other => anyhow::Error::new(other),
    }
}

/// "N parameters", or with LoRA the trainable adapters against the frozen base (as PEFT's
/// `print_trainable_parameters` puts it).
fn describe_parameters(trainer: &Trainer, lora: Option<&headroom_train::strategy::Lora>) -> String {
    let model = trainer.model();
    let trainable = model.num_params() as u64;
    match lora {
        None => format!("{} parameters", group_digits(trainable)),
        Some(l) => {
            let frozen = model.num_frozen_params() as u64;
            format!(
                "{l}: {} trainable parameters of {} ({:.2} %), the base frozen",
                group_digits(trainable),
                group_digits(trainable + frozen),
                100.0 * trainable as f64 / (trainable + frozen).max(1) as f64
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use headroom_train::prepare::PreparedRun;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TrainArgs,
    }

    fn args(flags: &[&str]) -> TrainArgs {
        Cli::parse_from(std::iter::once("train").chain(flags.iter().copied())).args
    }

    /// A save of gpt-tiny trained for one step of micro-batch 2 on 2 ranks (threads).
    fn two_rank_save(dir: &Path) -> PathBuf {
        let config = TrainConfig {
            model: Some("gpt-tiny".into()),
            seq_len: Some(32),
            micro_batch: Some(2),
            accumulation: Some(1),
            data_parallel: Some(2),
            steps: Some(1),
            save_every: Some(1),
            eval_batches: Some(1),
            save_dir: Some(dir.to_path_buf()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        let corpus = Corpus::bundled();
        let prepared: PreparedRun =
            prepare(config, &corpus, &Pins::default(), PrepareOptions::default()).unwrap();
        launch(&prepared, Arc::new(corpus), LaunchOptions::default()).unwrap();
        dir.join("step-000001")
    }

    #[test]
    fn the_mpirun_jobs_size_is_applied_before_the_resumed_runs_checks() {
        let dir = tempfile::tempdir().unwrap();
        let save = two_rank_save(dir.path());
        let resume = args(&["--resume", save.to_str().unwrap()]);
        // One rank continues the 2-rank run's effective batch of 4 by accumulating 2.
        let (one, _, _) = configure(&resume, TrainConfig::default(), Some(1), true).unwrap();
        assert_eq!(one.data_parallel, 1);
        assert_eq!((one.micro_batch(), one.accumulation()), (2, 2));
        // Three ranks cannot split 4 sequences with micro-batch 2: refused, as with threads.
        let threads = TrainConfig {
            data_parallel: Some(3),
            ..Default::default()
        };
        let by_threads = configure(&resume, threads, None, true).unwrap_err();
        let by_job = configure(&resume, TrainConfig::default(), Some(3), true).unwrap_err();
        assert_eq!(by_job.to_string(), by_threads.to_string());
    }

    #[test]
    fn auto_under_mpirun_is_refused_when_asked_for_and_said_when_it_was_the_default() {
        let explicit = configure(&args(&["--auto"]), TrainConfig::default(), Some(2), true);
        let refusal = explicit.unwrap_err().to_string();
        assert!(refusal.contains("--auto under mpirun -n 2"), "{refusal}");
        // By default alone it searches; as a rank of a job it runs the configured strategy.
        let (_, _, alone) = configure(&args(&[]), TrainConfig::default(), None, true).unwrap();
        assert!(alone.auto);
        let (config, _, ranked) =
            configure(&args(&[]), TrainConfig::default(), Some(2), true).unwrap();
        assert!(!ranked.auto);
        assert_eq!(config.data_parallel, 2);
    }
}
