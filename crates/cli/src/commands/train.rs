//! `headroom train`: trains a model on headroom's engine inside a device budget and reports
//! where every byte went. With no arguments it runs the embedded default (a small GPT on the
//! bundled corpus); every lever is a flag or a key of `--config FILE` (flags win).

use super::plan_output::group_digits;
use super::train_group::{collective_deadline, group_outcome, mpi_rank, on_rank, timed_out};
use crate::report::progress::Progress;
use crate::report::timeline::write_timeline_svg;
use crate::report::train_report::print_report;
use crate::signals::{Interrupted, StopSignals, name};
use anyhow::{Context, bail};
use clap::Args;
use headroom_comm::{Communicator, ThreadGroup};
use headroom_memory::output::{check_writable, write_output};
use headroom_memory::size::format_bytes;
use headroom_memory::timeline::timeline;
use headroom_memory::{Device, Snapshot};
use headroom_tensor::on_kernel_threads;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::data::token_file::is_token_file;
use headroom_train::predict::Prediction;
use headroom_train::prepare::{PrepareError, PrepareOptions, prepare};
use headroom_train::recompute::policy::BudgetDecision;
use headroom_train::report::TrainReport;
use headroom_train::save;
use headroom_train::strategy::Pins;
use headroom_train::{TrainError, Trainer};
use std::path::{Path, PathBuf};

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
    let (mut config, pins, mut options) = match &args.resume {
        Some(dir) => {
            // The saved run's weights replace whatever it started from.
            let mut c = resumed_config(dir, &merged)?;
            c.init_from = None;
            (c, Pins::default(), PrepareOptions::default())
        }
        None => {
            let pins = merged.pins();
            let options = PrepareOptions {
                auto: args.auto || (!args.no_auto && !pins.any() && !args.find_batch_size),
                find_batch_size: args.find_batch_size.then_some(MAX_MICRO_BATCH),
            };
            (merged.resolve()?, pins, options)
        }
    };
    if let Some(comm) = &mpi {
        config.data_parallel = comm.world_size();
        // The search times kernels on each rank's machine: ranks could choose differently.
        options.auto = false;
    }
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
    let run = RankRun {
        args: &args,
        config: &config,
        corpus: &corpus,
        prepared: &prepared,
        stop: &signals.requested,
    };
    let stopped = if let Some(comm) = mpi {
        let rank = comm.rank();
        // An MPI rank stays on the thread that initialised MPI (each rank is its own process).
        run.train(Some(comm)).map_err(|e| on_rank(e, rank))?
    } else if config.data_parallel == 1 {
        on_kernel_threads(|| run.train(None))?
    } else {
        let deadline = collective_deadline(Some(config.collective_timeout_s));
        let outcomes = ThreadGroup::run(config.data_parallel, deadline, |rank| {
            let index = rank.rank();
            let outcome = run.train(Some(Box::new(rank)));
            if let Err(e) = &outcome
                && timed_out(e)
            {
                // The stuck rank's thread may never return to be joined: end the process.
                eprintln!("error: rank {index}: {e:#}");
                std::process::exit(1);
            }
            outcome
        });
        group_outcome(outcomes)?
    };
    if let (Some((step, at, root)), Some(signal)) = (stopped, signals.received()) {
        eprintln!(
            "{} after step {step} of {}: saved to {}; continue with: headroom train --resume {}",
            name(signal),
            config.steps,
            at.display(),
            root.display()
        );
        return Err(Interrupted { signal }.into());
    }
    Ok(())
}

/// Where a run stopped by a signal ended: its step, its save and the save directory.
pub(super) type Stopped = (u64, PathBuf, PathBuf);

/// Everything one rank needs to train.
struct RankRun<'a> {
    args: &'a TrainArgs,
    config: &'a RunConfig,
    corpus: &'a Corpus,
    prepared: &'a headroom_train::prepare::PreparedRun,
    stop: &'a std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl RankRun<'_> {
    /// Trains one rank (the only one without `comm`); rank 0 shows progress, writes the
    /// outputs, and when a signal stopped the run saves it. Returns the step, save and save
    /// directory of a stopped run.
    fn train(&self, comm: Option<Box<dyn Communicator>>) -> anyhow::Result<Option<Stopped>> {
        let config = self.config;
        let lead = comm.as_ref().is_none_or(|c| c.rank() == 0);
        let device = Device::cpu(config.device_memory, config.allocator.config());
        if lead {
            device
                .lock()
                .trace_mut()
                .record_history(true, TRACE_ENTRIES);
        }
        let mut trainer = match comm {
            Some(comm) => Trainer::on_rank(config.clone(), self.corpus, device.clone(), comm),
            None => Trainer::on_device(config.clone(), self.corpus, device.clone()),
        }
        .map_err(explain)?;
        if let Some(dir) = &self.args.resume {
            trainer.resume(dir).map_err(explain)?;
        }
        if lead {
            if let Some(d) = trainer.budget_decision() {
                print_budget_decision(d, trainer.model().depth());
            }
            eprintln!(
                "headroom train: {} ({}), {} on {}, micro-batch {} × accumulation {}{} × {} tokens, {} steps, device budget {}{}",
                trainer.model().name(),
                describe_parameters(trainer.model(), config.lora.as_ref()),
                config.strategy.precision,
                self.corpus.name,
                config.micro_batch(),
                config.accumulation(),
                match config.data_parallel {
                    1 => String::new(),
                    n => format!(" × {n} ranks"),
                },
                trainer.seq_len(),
                config.steps,
                format_bytes(config.device_memory),
                if config.data_parallel > 1 {
                    " per rank"
                } else {
                    ""
                },
            );
        }
        trainer.set_prepared(self.prepared);
        trainer.set_stop_flag(self.stop.clone());
        // A fault injected on purpose (tests of how a group ends): HEADROOM_FAULT=RANK:KIND@STEP.
        if let Ok(spec) = std::env::var("HEADROOM_FAULT") {
            let fault = headroom_train::fault_for_rank(&spec, trainer.rank().0)
                .map_err(anyhow::Error::msg)?;
            trainer.set_hooks(headroom_train::TrainerHooks {
                fault,
                ..Default::default()
            });
        }
        let progress = Progress::new(config.steps, trainer.step(), lead);
        let result = trainer.train(&mut |event| progress.event(event));
        progress.finish();
        let report = result.map_err(explain)?.clone();
        // Every rank joins the save of a stopped run (ZeRO-1 gathers its shards).
        let saved = match report.stopped_at_step {
            Some(step) => {
                let root = config
                    .save_dir
                    .clone()
                    .unwrap_or_else(|| DEFAULT_SAVE_DIR.into());
                Some((step, trainer.save(&root).map_err(explain)?, root))
            }
            None => None,
        };
        // Rank 0 reports every rank's peaks; then every collective of the run is behind this
        // rank.
        let mut report = report;
        report.ranks = trainer.gather_rank_peaks().map_err(explain)?.to_vec();
        trainer.complete();
        if !lead {
            return Ok(None);
        }
        write_outputs(self.args, &report, &device, &trainer)?;
        Ok(saved)
    }
}

/// Where a run stopped by a signal is saved when no --save-dir was given.
const DEFAULT_SAVE_DIR: &str = "headroom-save";

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
/// cannot lose them), then the text report.
fn write_outputs(
    args: &TrainArgs,
    report: &TrainReport,
    device: &Device,
    trainer: &Trainer,
) -> anyhow::Result<()> {
    let config = trainer.config();
    let timeline_path = (!args.no_timeline).then_some(&args.timeline);
    if let Some(path) = timeline_path {
        let series = timeline(device.lock().trace().entries(), 2000);
        let title = format!(
            "headroom train: {} ({}), device memory by category",
            trainer.model().name(),
            config.strategy.precision
        );
        write_timeline_svg(&series, Some(config.device_memory), &title, path)?;
    }
    if let Some(path) = &args.snapshot {
        Snapshot::capture(&device.lock())
            .write_pickle(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.json_report {
        let json = serde_json::to_vec_pretty(report)?;
        write_output(path, &json).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("JSON report written to {}", path.display());
    }
    print_report(report, device, timeline_path.map(|p| p.as_path()));
    Ok(())
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

fn explain_prepare(e: PrepareError) -> anyhow::Error {
    match e {
        PrepareError::Train(e) => explain(e),
        other => anyhow::Error::new(other),
    }
}

/// "N parameters", or with LoRA the trainable adapters against the frozen base (as PEFT's
/// `print_trainable_parameters` puts it).
fn describe_parameters(
    model: &dyn headroom_nn::Model,
    lora: Option<&headroom_train::strategy::Lora>,
) -> String {
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
