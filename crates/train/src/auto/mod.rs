//! Planning headroom's own runs: the fastest strategy that fits a device budget, found by dry
//! runs (exact memory, fragmentation included) and a measured speed model (step time from the
//! dry run's counted work). `headroom plan` prints the result for a headroom model;
//! `headroom train --auto` runs the recommended strategy.
//!
//! The search, with the effective batch (micro-batch × accumulation) fixed and pinned levers
//! held:
//! - strategies are grouped by the planner's fidelity tier (fp32 or mixed precision with AdamW
//!   first; pure bf16 or bf16 AdamW states next; other optimizer families only when pinned) and
//!   a tier is searched only when no strategy of the tiers before it fits;
//! - for every precision × optimizer × checkpoint policy × attention of a tier, micro-batches are
//!   tried from the largest divisor of the effective batch down and the first that fits ends
//!   the descent (a smaller micro-batch needs no more memory and runs no faster);
//! - fitting plans rank by predicted step time, then by lower peak.
//!
//! Not for: other models (the planner's analytical model covers Hugging Face configs).

pub mod candidate;
pub mod speed;

pub use candidate::{Candidate, OwnPlan, evaluate};
pub use speed::{CalibrationShapes, SpeedModel, StepTime};

use crate::config::{OptimizerChoice, RunConfig};
use crate::data::Corpus;
use crate::policy::CheckpointPolicy;
use crate::trainer::{TrainError, model_spec};
use headroom_memory::format_bytes;
use headroom_nn::models::ModelSpec;
use headroom_plan::strategy::{Attention, Precision};
use std::cmp::Ordering;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Instant;

/// Levers the user fixed; `None` means "choose".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pins {
    pub precision: Option<Precision>,
    pub optimizer: Option<OptimizerChoice>,
    pub checkpoint: Option<CheckpointPolicy>,
    pub attention: Option<Attention>,
    pub micro_batch: Option<usize>,
    pub accumulation: Option<usize>,
}

impl Pins {
    /// Whether any lever is pinned.
    pub fn any(&self) -> bool {
        *self != Pins::default()
    }
}

/// The outcome of a search.
#[derive(Clone, Debug)]
pub struct AutoPlan {
    /// Plans that fit, best first.
    pub fitting: Vec<OwnPlan>,
    /// Every plan dry-run that did not fit.
    pub rejected: Vec<OwnPlan>,
    pub speed: SpeedModel,
    pub effective_batch: usize,
    pub seq_len: usize,
    /// Seconds the search took (calibration and dry runs).
    pub seconds: f64,
}

impl AutoPlan {
    pub fn recommended(&self) -> Option<&OwnPlan> {
        self.fitting.first()
    }

    /// Dry runs made.
    pub fn evaluated(&self) -> usize {
        self.fitting.len() + self.rejected.len()
    }

    /// When nothing fits: the plan with the lowest peak.
    pub fn closest(&self) -> Option<&OwnPlan> {
        if !self.fitting.is_empty() {
            return None;
        }
        self.rejected
            .iter()
            .min_by_key(|p| p.memory.per_device_peak_bytes)
    }

    /// One or two lines: the choice, and what a faster plan would have needed.
    pub fn reason(&self, budget: u64) -> String {
        let Some(best) = self.recommended() else {
            let closest = self.closest().map_or(0, |p| p.memory.per_device_peak_bytes);
            return format!(
                "no strategy fits {}: the smallest of {} dry runs needs {}",
                format_bytes(budget),
                self.evaluated(),
                format_bytes(closest)
            );
        };
        let mut out = format!(
            "{} — the fastest of {} dry-run strategies that fit {} (predicted {:.0} tokens/s, peak {})",
            best.strategy.describe(),
            self.fitting.len(),
            format_bytes(budget),
            best.time.tokens_per_s,
            format_bytes(best.memory.per_device_peak_bytes)
        );
        let faster = self
            .rejected
            .iter()
            .filter(|p| p.fidelity_tier <= best.fidelity_tier && p.time.step_s < best.time.step_s)
            .min_by(|a, b| by(a.time.step_s, b.time.step_s));
        if let Some(f) = faster {
            out += &format!(
                "\n  faster but over the budget: {} needs {} ({:.0} tokens/s)",
                f.strategy.describe(),
                format_bytes(f.memory.per_device_peak_bytes),
                f.time.tokens_per_s
            );
        }
        out
    }
}

fn by(a: f64, b: f64) -> Ordering {
    a.partial_cmp(&b).unwrap_or(Ordering::Equal)
}

/// Fitting plans: fidelity tier, predicted step time, lower peak, larger micro-batch.
fn rank(a: &OwnPlan, b: &OwnPlan) -> Ordering {
    a.fidelity_tier
        .cmp(&b.fidelity_tier)
        .then(by(a.time.step_s, b.time.step_s))
        .then(
            a.memory
                .per_device_peak_bytes
                .cmp(&b.memory.per_device_peak_bytes),
        )
        .then(b.strategy.micro_batch.cmp(&a.strategy.micro_batch))
}

/// Searches the strategies `pins` leave open for the fastest that fits `config.device_memory`.
/// The effective batch is `config`'s (or the pinned micro-batch × accumulation).
pub fn plan(config: &RunConfig, corpus: &Corpus, pins: &Pins) -> Result<AutoPlan, TrainError> {
    let started = Instant::now();
    let spec = model_spec(config)?;
    let seq_len = config.seq_len.unwrap_or_else(|| spec.default_seq_len());
    let effective_batch = match (pins.micro_batch, pins.accumulation) {
        (Some(m), Some(a)) => m * a,
        _ => config.effective_batch(),
    };
    let splits = splits(effective_batch, pins);
    if splits.is_empty() {
        return Err(TrainError::Config(crate::config::ConfigError::Value {
            key: "micro_batch",
            value: format!("{:?}", pins.micro_batch),
            reason: format!(
                "does not divide the effective batch of {effective_batch}; pin a divisor, or pin accumulation instead"
            ),
        }));
    }
    let speed = SpeedModel::measure(calibration_shapes(&spec, seq_len, splits[0].0))?;
    let mut fitting = Vec::new();
    let mut rejected = Vec::new();
    for tier in combos(&spec, pins) {
        let outcomes = parallel_map(&tier, |combo| {
            largest_fitting(&splits, |&(micro_batch, accumulation)| {
                let c = Candidate {
                    micro_batch,
                    accumulation,
                    ..*combo
                };
                evaluate(config, corpus, &c, &speed)
            })
        });
        for outcome in outcomes {
            let (fit, misses) = outcome?;
            fitting.extend(fit);
            rejected.extend(misses);
        }
        if !fitting.is_empty() {
            break;
        }
    }
    fitting.sort_by(rank);
    Ok(AutoPlan {
        fitting,
        rejected,
        speed,
        effective_batch,
        seq_len,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The first of `splits` (largest micro-batch first) that fits, by bisection: memory does not
/// grow as the micro-batch shrinks, so the fitting splits are a suffix of the list. Returns the
/// fitting plan (if any) and the plans that did not fit.
fn largest_fitting(
    splits: &[(usize, usize)],
    eval: impl Fn(&(usize, usize)) -> Result<OwnPlan, TrainError>,
) -> Result<(Option<OwnPlan>, Vec<OwnPlan>), TrainError> {
    let mut misses = Vec::new();
    let first = eval(&splits[0])?;
    if first.fits {
        return Ok((Some(first), misses));
    }
    misses.push(first);
    let (mut lo, mut hi) = (0, splits.len() - 1); // lo: does not fit; hi: unknown until tried
    let mut best = None;
    if hi > lo {
        let last = eval(&splits[hi])?;
        if !last.fits {
            misses.push(last);
            return Ok((None, misses));
        }
        best = Some(last);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let plan = eval(&splits[mid])?;
        if plan.fits {
            hi = mid;
            best = Some(plan);
        } else {
            lo = mid;
            misses.push(plan);
        }
    }
    Ok((best, misses))
}

/// `f` over `items` on all cores, results in the items' order. Dry runs are independent (each
/// has its own shape-only device; the engine's global state is per thread).
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, AtomicOrdering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    results.lock().expect("no worker panics while holding it")[i] = Some(r);
                }
            });
        }
    });
    results
        .into_inner()
        .expect("workers finished")
        .into_iter()
        .map(|r| r.expect("every item was mapped"))
        .collect()
}

/// Micro-batch × accumulation splits of `effective` allowed by the pins, largest micro-batch
/// first.
fn splits(effective: usize, pins: &Pins) -> Vec<(usize, usize)> {
    (1..=effective)
        .rev()
        .filter(|m| effective.is_multiple_of(*m))
        .map(|m| (m, effective / m))
        .filter(|&(m, _)| pins.micro_batch.is_none_or(|p| p == m))
        .filter(|&(_, a)| pins.accumulation.is_none_or(|p| p == a))
        .collect()
}

/// Precision × optimizer × checkpoint × attention, grouped by fidelity tier (best first). The
/// micro-batch is filled in by the search.
fn combos(spec: &ModelSpec, pins: &Pins) -> Vec<Vec<Candidate>> {
    // fp16-mixed has bf16-mixed's memory and speed with loss scaling on top: only when pinned.
    let precisions = pins.precision.map_or(
        vec![Precision::Fp32, Precision::Bf16Mixed, Precision::Bf16],
        |p| vec![p],
    );
    // AdamW, or its bf16-state variant as a memory lever; other families only when pinned.
    let optimizers = pins.optimizer.map_or(
        vec![OptimizerChoice::Adamw, OptimizerChoice::AdamwBf16],
        |o| vec![o],
    );
    let depth = spec.depth();
    let gpt = matches!(spec, ModelSpec::Gpt(_));
    let checkpoints: Vec<CheckpointPolicy> = match pins.checkpoint {
        Some(c) => vec![c],
        None => {
            let mut v = vec![CheckpointPolicy::None];
            if gpt {
                v.push(CheckpointPolicy::Selective);
            }
            v.extend(
                [4, 2]
                    .into_iter()
                    .filter(|&k| k < depth)
                    .map(CheckpointPolicy::EveryNth),
            );
            if depth >= 9 {
                v.push(CheckpointPolicy::Sqrt);
            }
            v.push(CheckpointPolicy::EveryNth(1));
            v
        }
    };
    // A residual MLP has no attention: the kind changes nothing there.
    let attentions = match (pins.attention, gpt) {
        (Some(a), _) => vec![a],
        (None, true) => vec![Attention::Naive, Attention::MemoryEfficient],
        (None, false) => vec![Attention::Naive],
    };
    let mut tiers: Vec<Vec<Candidate>> = Vec::new();
    for &precision in &precisions {
        for &optimizer in &optimizers {
            for &checkpoint in &checkpoints {
                for &attention in &attentions {
                    let c = Candidate {
                        precision,
                        optimizer,
                        checkpoint,
                        attention,
                        micro_batch: 1,
                        accumulation: 1,
                    };
                    let tier = usize::from(c.fidelity_tier());
                    if tiers.len() <= tier {
                        tiers.resize(tier + 1, Vec::new());
                    }
                    tiers[tier].push(c);
                }
            }
        }
    }
    tiers.retain(|t| !t.is_empty());
    tiers
}

/// The model's largest matmul at the largest micro-batch and its attention head shape.
pub fn calibration_shapes(
    spec: &ModelSpec,
    seq_len: usize,
    micro_batch: usize,
) -> CalibrationShapes {
    let rows = (micro_batch * seq_len).clamp(64, 4096);
    match spec {
        ModelSpec::Gpt(c) => CalibrationShapes {
            matmul: (rows, c.width, c.ffn),
            attention: Some((micro_batch.min(4) * c.heads, seq_len, c.width / c.heads)),
        },
        ModelSpec::Resmlp(c) => CalibrationShapes {
            matmul: (rows, c.width, c.hidden),
            attention: None,
        },
    }
}
