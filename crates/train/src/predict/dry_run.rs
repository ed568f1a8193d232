//! Predicting a run's memory by a dry run: the trainer itself runs a few steps (and a validation)
//! on a shape-only device — the real caching allocator handing out addresses without bytes — so
//! every allocation, saved tensor and free of a real step happens in the same order and the
//! peaks per category, fragmentation included, are the ones the real run will measure.
//!
//! Not for: models other than headroom's own (the planner's analytical model covers those).

use crate::config::RunConfig;
use crate::data::Corpus;
use crate::trainer::{TrainError, TrainEvent, Trainer};
use headroom_comm::ShapeOnlyRank;
use headroom_memory::{AllocatorKind, ArenaError, Device, MemoryPeaks};
use headroom_strategy::largest_fitting;
use headroom_tensor::backend::work::{Work, count_work, uncounted, work_so_far};
use serde::Serialize;
use std::time::Instant;

/// Steps a dry run takes: optimizer state exists from the first update, so the second step is
/// already the steady state; a third makes any growth visible.
const DRY_STEPS: u64 = 3;
/// Micro-batches a dry-run step accumulates: from the second on every micro-batch allocates and
/// frees the same (the gradients already exist), so more would only cost time; their work is
/// extrapolated from the last one.
const DRY_ACCUMULATION: usize = 2;
/// Capacity of the dry run that measures the peaks: never reached, so nothing is reclaimed.
const UNLIMITED: u64 = 1 << 46;

/// The dry run's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// Peaks, the breakdown at the allocated peak and between steps, each category's peak.
    #[serde(flatten)]
    pub memory: MemoryPeaks,
    /// Whether the run fits its device budget (a dry run with that capacity completed).
    pub fits: bool,
    pub seconds: f64,
    /// Offloaded runs: the host and disk tiers' bytes per category, swap buffers included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<crate::report::OffloadReport>,
}

/// What one dry run leaves: the device (for its statistics), whether the run completed
/// (`false`: it ran out of memory, possibly while building the model), and the counted work of
/// its last micro-batch.
struct DryOutcome {
    device: Device,
    completed: bool,
    micro_work: Option<Work>,
    offload: Option<crate::report::OffloadReport>,
}

/// Runs the trainer on a shape-only device of `capacity` bytes for up to three steps (at least
/// one) of at most [`DRY_ACCUMULATION`] micro-batches each.
fn dry_run(
    config: &RunConfig,
    corpus: &Corpus,
    capacity: u64,
    on_event: &mut dyn FnMut(TrainEvent),
) -> Result<DryOutcome, TrainError> {
    let mut c = config.clone();
    c.steps = c.steps.clamp(1, DRY_STEPS);
    // A planned arena serves whole steps: the dry run makes every micro-batch's requests.
    if c.allocator != AllocatorKind::Planned {
        c = c.with_split(c.micro_batch(), c.accumulation().min(DRY_ACCUMULATION));
    }
    c.eval_every = 0;
    c.save_dir = None;
    c.oom_recovery = false;
    let device = Device::shape_only(capacity, c.allocator.config());
    let mut micro_work = None;
    let mut offload = None;
    // A rank of a data-parallel group: rank 0, which holds the largest shards (a split
    // model's ranks hold equal slices).
    let world = c.ranks();
    if c.allocator == AllocatorKind::Planned {
        let plan = uncounted(|| super::arena::record_arena_layout(&c, corpus, (0, world)))?;
        if let Err(e) = device.lock().install_layout(plan) {
            return match e {
                ArenaError::TooLarge { .. } => Ok(DryOutcome {
                    device: device.clone(),
                    completed: false,
                    micro_work: None,
                    offload: None,
                }),
                other => Err(other.into()),
            };
        }
    }
    // Building the model is not a step's work: a one-step run's count starts at its step.
    let built = uncounted(|| {
        if world > 1 {
            Trainer::on_rank(
                c,
                corpus,
                device.clone(),
                Box::new(ShapeOnlyRank::new(0, world)),
            )
        } else {
            Trainer::on_device(c, corpus, device.clone())
        }
    });
    let outcome = built.and_then(|mut trainer| {
        let r = trainer.train(on_event).map(drop);
        micro_work = trainer.last_micro_batch_work();
        offload = trainer.report().offload.clone();
        r
    });
    let completed = match outcome {
        Ok(()) => true,
        Err(TrainError::OutOfMemory(_)) => false,
        Err(e) => return Err(e),
    };
    Ok(DryOutcome {
        device,
        completed,
        micro_work,
        offload,
    })
}

/// Whether a dry run with `config.device_memory` of capacity completes.
fn fits_budget(config: &RunConfig, corpus: &Corpus) -> Result<bool, TrainError> {
    Ok(dry_run(config, corpus, config.device_memory, &mut |_| {})?.completed)
}

/// A dry run's prediction with the work of its last (steady-state) step.
#[derive(Debug, Clone, PartialEq)]
pub struct DryRun {
    pub prediction: Prediction,
    /// Kernels' work of one steady-state optimizer step (all its micro-batches).
    pub step_work: Work,
}

/// Dry-runs `config` (recomputing what its checkpoint policy plans): peaks, fit within
/// `config.device_memory`, the work of a steady-state step and the bytes held between steps.
///
/// The first run has no capacity limit, so the allocator never reclaims: a run whose reserved
/// peak fits takes the same path under the budget, and one whose allocated peak exceeds it
/// cannot fit. In between, a second run under the budget decides, and when it completes its
/// figures are the prediction (the allocator freed cached blocks to fit, as the real run will).
/// A plan that does not fit reports the unlimited run's figures: its reserved peak is a budget
/// that certainly suffices.
pub fn dry_run_counted(config: &RunConfig, corpus: &Corpus) -> Result<DryRun, TrainError> {
    let started = Instant::now();
    let mut marks: Vec<(u64, Work)> = Vec::new();
    let (run, _) = count_work(|| {
        dry_run(config, corpus, UNLIMITED, &mut |event| {
            if let TrainEvent::Step { step, .. } = event
                && let Some(w) = work_so_far()
            {
                marks.push((step, w));
            }
        })
    });
    let unlimited = run?;
    let completed = unlimited.completed;
    let mut stats = unlimited.device.stats();
    let (peak_allocated, peak_reserved) = (
        stats.allocated_bytes.all.peak as u64,
        stats.reserved_bytes.all.peak as u64,
    );
    let budget = config.device_memory;
    let fits = if !completed || peak_allocated > budget {
        false
    } else if peak_reserved <= budget {
        true
    } else {
        let limited = dry_run(config, corpus, budget, &mut |_| {})?;
        if limited.completed {
            stats = limited.device.stats();
        }
        limited.completed
    };
    let mut step_work = match marks.as_slice() {
        [.., (_, before), (_, last)] => *last - *before,
        [(_, only)] => *only,
        [] => Work::default(),
    };
    // The micro-batches the dry run left out repeat the last one it ran.
    let ran = if config.allocator == AllocatorKind::Planned {
        config.accumulation()
    } else {
        config.accumulation().min(DRY_ACCUMULATION)
    };
    let skipped = config.accumulation() - ran;
    if let Some(micro) = unlimited.micro_work {
        step_work = step_work + micro.times(skipped as f64);
    }
    Ok(DryRun {
        prediction: Prediction {
            memory: MemoryPeaks::of(&stats),
            fits,
            seconds: started.elapsed().as_secs_f64(),
            offload: unlimited.offload,
        },
        step_work,
    })
}

/// Dry-runs `config` and reports its peaks and whether it fits.
pub fn predict(config: &RunConfig, corpus: &Corpus) -> Result<Prediction, TrainError> {
    Ok(dry_run_counted(config, corpus)?.prediction)
}

/// The largest micro-batch (at most `max`) whose run fits the device budget, found by bisection
/// over dry runs — no real out-of-memory errors and no partial steps, unlike trying real steps
/// (Accelerate's `find_executable_batch_size`, Lightning's `BatchSizeFinder`). Each candidate
/// plans its own recomputation. `None` if even one sequence does not fit.
pub fn largest_micro_batch(
    config: &RunConfig,
    corpus: &Corpus,
    max: usize,
) -> Result<Option<usize>, TrainError> {
    let candidates: Vec<usize> = (1..=max.max(1)).rev().collect();
    let (found, _) = largest_fitting(
        &candidates,
        |&m| -> Result<_, TrainError> {
            let split = config.with_split(m, config.accumulation());
            Ok((m, fits_budget(&split, corpus)?))
        },
        |&(_, fits)| fits,
    )?;
    Ok(found.map(|(m, _)| m))
}
