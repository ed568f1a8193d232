//! `headroom train`: trains a model on headroom's engine inside a device budget and reports
//! where every byte went. With no arguments it runs the embedded default (a small GPT on the
//! bundled corpus); every lever is a flag or a key of `--config FILE` (flags win).
//!
//! Not for: what rank 0 prints (`train_console`), the run's files (`train_outputs`), resuming
//! (`train_resume`) or the errors' fixes (`train_errors`).

use super::train_console::{lead_observer, print_prediction};
use super::train_errors::{explain_launch, explain_prepare};
use super::train_group::mpi_rank;
use super::train_outputs::{check_outputs, write_outputs};
use super::train_resume::{print_resume_hint, resumed_config};
use crate::signals::{Interrupted, StopSignals};
use anyhow::{Context, bail};
use clap::Args;
use headroom_memory::size::format_bytes;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::data::token_file::is_token_file;
use headroom_train::launch::{LaunchOptions, launch};
use headroom_train::predict::Prediction;
use headroom_train::prepare::{PrepareOptions, prepare};
use headroom_train::strategy::Pins;
use std::path::PathBuf;
use std::sync::Arc;

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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use headroom_train::prepare::PreparedRun;
    use std::path::Path;

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
