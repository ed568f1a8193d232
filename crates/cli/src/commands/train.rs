//! `headroom train`: trains a model on headroom's engine inside a device budget and reports
//! where every byte went. With no arguments it runs the embedded default (a small GPT on the
//! bundled corpus); every lever is a flag or a key of `--config FILE` (flags win).

use super::plan_output::group_digits;
use crate::report::timeline::write_timeline_svg;
use crate::report::train_report::print_report;
use anyhow::Context;
use clap::Args;
use headroom_memory::size::{ByteSize, format_bytes};
use headroom_memory::snapshot::write_atomic;
use headroom_memory::timeline::timeline;
use headroom_memory::{AllocatorConfig, Device, Snapshot};
use headroom_train::auto::Pins;
use headroom_train::config::{OptimizerChoice, RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::policy::recompute_for;
use headroom_train::report::AutoChoice;
use headroom_train::{TrainError, TrainEvent, Trainer};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// A TOML file with any of the keys below (as `headroom plan --emit headroom` writes);
    /// flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Model preset (gpt-small, gpt-tiny, gpt-medium, resmlp) or a model TOML.
    #[arg(long)]
    pub model: Option<String>,
    /// Override the preset's number of layers (blocks).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Override the preset's width (the MLP is 4 × width).
    #[arg(long)]
    pub width: Option<usize>,
    /// Override the number of attention heads.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Sequence length in tokens (default: the model's context).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Dropout probability.
    #[arg(long)]
    pub dropout: Option<f32>,
    /// fp32 | bf16-mixed | fp16-mixed | bf16.
    #[arg(long)]
    pub precision: Option<String>,
    /// Sequences per forward/backward pass.
    #[arg(long)]
    pub micro_batch: Option<usize>,
    /// Micro-batches per optimizer step (effective batch = micro-batch × accumulation).
    #[arg(long)]
    pub accumulation: Option<usize>,
    /// sgd | sgd-momentum | adamw | adamw-bf16 | lamb.
    #[arg(long)]
    pub optimizer: Option<String>,
    /// Peak learning rate (after warm-up; cosine decay to a tenth).
    #[arg(long)]
    pub lr: Option<f32>,
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Clip gradients to this global norm (0 turns clipping off; default 1.0).
    #[arg(long)]
    pub grad_clip: Option<f32>,
    #[arg(long)]
    pub warmup_steps: Option<u64>,
    /// Optimizer steps to run.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Device memory budget, e.g. 512MiB or 2GiB (GB = 10^9, GiB = 2^30).
    #[arg(long)]
    pub device_memory: Option<ByteSize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Validate every N optimizer steps (and at the end); 0: only at the end.
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Validation batches per evaluation.
    #[arg(long)]
    pub eval_batches: Option<usize>,
    /// Empty the allocator's cache after each validation and report reserved bytes around it.
    #[arg(long)]
    pub empty_cache_after_eval: bool,
    /// Train on this text file instead of the bundled corpus.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Activation checkpointing: none, all, every:K, sqrt, budget:SIZE (least recomputation whose
    /// activation peak fits SIZE), selective.
    #[arg(long)]
    pub checkpoint: Option<String>,
    /// Attention implementation (naive).
    #[arg(long)]
    pub attention: Option<String>,
    /// Write checkpoints under this directory.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N steps (and at the end) when --checkpoint-dir is set.
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Before training, find the largest micro-batch that fits the device budget (by dry runs
    /// on the real allocator, no trial steps) and train with it.
    #[arg(long, conflicts_with = "auto")]
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
    /// Stop at the first out-of-memory error instead of retrying the step with half the
    /// micro-batch and twice the accumulation.
    #[arg(long)]
    pub no_oom_recovery: bool,
    /// Continue a run from a checkpoint directory (or its step-NNNNNN folder), bit-exactly.
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

impl TrainArgs {
    fn as_config(&self) -> TrainConfig {
        TrainConfig {
            model: self.model.clone(),
            layers: self.layers,
            width: self.width,
            heads: self.heads,
            seq_len: self.seq_len,
            dropout: self.dropout,
            precision: self.precision.clone(),
            micro_batch: self.micro_batch,
            accumulation: self.accumulation,
            optimizer: self.optimizer.clone(),
            lr: self.lr,
            weight_decay: self.weight_decay,
            grad_clip: self.grad_clip,
            warmup_steps: self.warmup_steps,
            steps: self.steps,
            device_memory: self.device_memory,
            seed: self.seed,
            eval_every: self.eval_every,
            eval_batches: self.eval_batches,
            empty_cache_after_eval: self.empty_cache_after_eval.then_some(true),
            data: self.data.clone(),
            checkpoint: self.checkpoint.clone(),
            attention: self.attention.clone(),
            checkpoint_dir: self.checkpoint_dir.clone(),
            checkpoint_every: self.checkpoint_every,
            oom_recovery: self.no_oom_recovery.then_some(false),
            zero_stage: None,
            offload_optimizer: None,
            offload_params: None,
        }
    }
}

/// Trace entries kept for the timeline and snapshot (oldest dropped beyond this).
const TRACE_ENTRIES: usize = 2_000_000;

pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => TrainConfig::from_file(path)?,
        None => TrainConfig::default(),
    };
    let merged = file.overridden_by(args.as_config());
    let pins = pins_of(&merged);
    let mut config = merged.resolve()?;
    let corpus = match &config.data {
        Some(path) => Corpus::from_file(path)?,
        None => Corpus::bundled(),
    };
    let auto = args.auto
        || (!args.no_auto && !pins.any() && !args.find_batch_size && args.resume.is_none());
    let mut auto_choice = None;
    if auto {
        let (chosen, choice) = choose_strategy(&config, &corpus, &pins)?;
        config = chosen;
        auto_choice = Some(choice);
    }
    let device = Device::cpu(config.device_memory, AllocatorConfig::default());
    device
        .lock()
        .trace_mut()
        .record_history(true, TRACE_ENTRIES);
    let mut trainer =
        Trainer::on_device(config.clone(), &corpus, device.clone()).map_err(explain)?;
    if let Some(choice) = auto_choice {
        trainer.set_auto_choice(choice);
    }
    if let Some(dir) = &args.resume {
        trainer.resume(dir).map_err(explain)?;
    }
    let policy = config.checkpoint_policy();
    if args.find_batch_size {
        let (spec, dtype, seq_len) = (
            trainer.model_spec().clone(),
            trainer.precision().compute,
            trainer.seq_len(),
        );
        let plan_for = |m: usize| -> Result<headroom_nn::Recompute, TrainError> {
            Ok(recompute_for(policy, &spec, dtype, m, seq_len)?.0)
        };
        let found = headroom_train::predict::largest_micro_batch(&config, &corpus, 4096, &plan_for)
            .map_err(explain)?;
        let Some(m) = found else {
            anyhow::bail!(
                "not even a micro-batch of one sequence fits the device budget of {}: raise --device-memory, shorten --seq-len, or checkpoint activations",
                format_bytes(config.device_memory)
            );
        };
        eprintln!(
            "--find-batch-size: the largest micro-batch that fits {} is {m} (dry runs)",
            format_bytes(config.device_memory)
        );
        config.micro_batch = m;
        trainer.set_micro_batch(m);
    }
    let (recompute, decision) = recompute_for(
        policy,
        trainer.model_spec(),
        trainer.precision().compute,
        config.micro_batch,
        trainer.seq_len(),
    )?;
    if let Some(d) = &decision {
        let (plan, cost, peak) = &d.optimal;
        eprintln!(
            "checkpoint budget {}: {} segments recomputing {} of {} blocks (activation peak {} in a dry run){}",
            format_bytes(d.budget),
            plan.segments.len(),
            cost.recompute,
            trainer.model().depth(),
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
    let prediction =
        headroom_train::predict::predict(&config, &corpus, &recompute).map_err(explain)?;
    eprintln!(
        "dry run: predicted peak {} allocated, {} reserved of the {} budget ({}; {:.0} ms)",
        format_bytes(prediction.peak_allocated_bytes),
        format_bytes(prediction.peak_reserved_bytes),
        format_bytes(config.device_memory),
        if prediction.fits {
            "fits"
        } else {
            "does not fit: expect out-of-memory recovery"
        },
        prediction.seconds * 1e3
    );
    trainer.set_recompute(recompute);
    trainer.set_prediction(&prediction);
    eprintln!(
        "headroom train: {} ({} parameters), {} on {}, micro-batch {} × accumulation {} × {} tokens, {} steps, device budget {}",
        trainer.model().name(),
        group_digits(trainer.model().num_params() as u64),
        config.precision,
        corpus.name,
        config.micro_batch,
        config.accumulation,
        trainer.seq_len(),
        config.steps,
        format_bytes(config.device_memory),
    );

    let progress = Progress::new(config.steps, trainer.step());
    let result = trainer.train(&mut |event| progress.event(event));
    progress.finish();
    let report = result.map_err(explain)?.clone();

    let timeline_path = (!args.no_timeline).then_some(&args.timeline);
    if let Some(path) = timeline_path {
        let series = timeline(device.lock().trace().entries(), 2000);
        let title = format!(
            "headroom train: {} ({}), device memory by category",
            trainer.model().name(),
            config.precision
        );
        write_timeline_svg(&series, Some(config.device_memory), &title, path)?;
    }
    if let Some(path) = &args.snapshot {
        Snapshot::capture(&device.lock())
            .write_pickle(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    print_report(&report, &device, timeline_path.map(|p| p.as_path()));
    if let Some(path) = &args.json_report {
        let json = serde_json::to_vec_pretty(&report)?;
        write_atomic(path, &json).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("JSON report written to {}", path.display());
    }
    Ok(())
}

/// The levers a user set (in flags or the config file): `--auto` keeps them.
fn pins_of(c: &TrainConfig) -> Pins {
    Pins {
        precision: c.precision.as_deref().and_then(|p| p.parse().ok()),
        optimizer: c
            .optimizer
            .as_deref()
            .and_then(|o| OptimizerChoice::parse(o).ok()),
        checkpoint: c.checkpoint.as_deref().and_then(|p| p.parse().ok()),
        attention: c.attention.as_deref().and_then(|p| p.parse().ok()),
        micro_batch: c.micro_batch,
        accumulation: c.accumulation,
    }
}

/// `--auto`: the fastest strategy that fits, printed with its reason.
fn choose_strategy(
    config: &RunConfig,
    corpus: &Corpus,
    pins: &Pins,
) -> anyhow::Result<(RunConfig, AutoChoice)> {
    let plan = headroom_train::auto::plan(config, corpus, pins).map_err(explain)?;
    let reason = plan.reason(config.device_memory);
    let Some(best) = plan.recommended() else {
        anyhow::bail!(
            "--auto: {reason}; raise --device-memory, shorten --seq-len, or lower the effective batch (--micro-batch × --accumulation)"
        );
    };
    eprintln!("auto: {reason}");
    let choice = AutoChoice {
        reason,
        dry_runs: plan.evaluated(),
        predicted_tokens_per_s: best.time.tokens_per_s,
    };
    Ok((best.strategy.apply(config), choice))
}

/// Adds the fix to errors a user can act on.
fn explain(e: TrainError) -> anyhow::Error {
    match e {
        TrainError::OutOfMemory(oom) => anyhow::anyhow!(
            "{oom}\nThe run needs more than the device budget of {}: raise --device-memory, or lower --micro-batch (raising --accumulation keeps the effective batch).",
            format_bytes(oom.capacity)
        ),
        other => anyhow::Error::new(other),
    }
}

/// A progress bar on a terminal, plain lines otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
}

impl Progress {
    fn new(total: u64, done: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30.cyan/blue} step {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_position(done);
            bar
        });
        Progress { bar, total }
    }

    fn event(&self, event: TrainEvent) {
        match event {
            TrainEvent::Step {
                step,
                loss,
                tokens_per_s,
                allocated,
                capacity,
                ..
            } => {
                let msg = format!(
                    "loss {loss:.4} | {:.0} tok/s | device {} / {}",
                    tokens_per_s,
                    format_bytes(allocated),
                    format_bytes(capacity)
                );
                match &self.bar {
                    Some(bar) => {
                        bar.set_position(step);
                        bar.set_message(msg);
                    }
                    None if step == 1 || step.is_multiple_of(10) || step == self.total => {
                        eprintln!("step {step}/{} {msg}", self.total)
                    }
                    None => {}
                }
            }
            TrainEvent::Validation { step, loss } => {
                self.line(format!("step {step}: validation loss {loss:.4}"))
            }
            TrainEvent::CacheEmptied {
                step,
                reserved_before,
                reserved_after,
            } => self.line(format!(
                "step {step}: empty_cache after validation: reserved {} → {}",
                format_bytes(reserved_before),
                format_bytes(reserved_after)
            )),
            TrainEvent::Warning(w) => self.line(format!("warning: {w}")),
            TrainEvent::OomRecovered { step, micro_batch, accumulation } => self.line(format!(
                "step {step}: out of memory; retrying with micro-batch {micro_batch} × accumulation {accumulation}"
            )),
            TrainEvent::Checkpoint { step, path } => {
                self.line(format!("step {step}: checkpoint written to {path}"))
            }
        }
    }

    fn line(&self, text: String) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
