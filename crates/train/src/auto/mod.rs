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
//! - fitting plans rank by predicted step time, then by lower peak; plans predicted within 5 % of
//!   the fastest count as equally fast, and among them the one closest to the configured
//!   strategy (fewest levers changed) is recommended.
//!
//! Layout: `space` (what is tried), `candidate` (one strategy and its evaluation by a counted
//! dry run), `speed` (the measured speed model), this module (the search and its outcome).
//!
//! Not for: other models (the planner's analytical model covers Hugging Face configs).

pub mod candidate;
pub mod space;
pub mod speed;

pub use candidate::{OwnPlan, evaluate};
pub use space::calibration_shapes;
pub use speed::{CalibrationShapes, SpeedModel, StepTime};

use space::combos;

use crate::config::RunConfig;
use crate::data::Corpus;
use crate::trainer::{TrainError, model_spec};
use headroom_memory::format_bytes;
use headroom_strategy::{Pins, Strategy, batch_splits, changed_levers, largest_fitting};
use std::cmp::Ordering;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Instant;

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
    /// Whether the model has attention (the residual MLP has none: its plans name no kind).
    pub has_attention: bool,
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
                "no strategy fits {}: the smallest of {} dry runs fits in {}",
                format_bytes(budget),
                self.evaluated(),
                format_bytes(closest)
            );
        };
        let fastest = self
            .fitting
            .iter()
            .map(|p| p.time.step_s)
            .fold(f64::INFINITY, f64::min);
        let which = if best.time.step_s <= fastest {
            "the fastest".to_string()
        } else {
            format!(
                "within {:.0} % of the fastest, and the closest to the configuration,",
                100.0 * SAME_SPEED
            )
        };
        let mut out = format!(
            "{} — {which} of {} dry-run strategies that fit {} (predicted {:.0} tokens/s, peak {})",
            best.strategy.describe(self.has_attention),
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
                "\n  faster but over the budget: {}, which fits in {} ({:.0} tokens/s)",
                f.strategy.describe(self.has_attention),
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
        (Some(m), Some(a)) => (m as usize).saturating_mul(a as usize),
        _ => config.effective_batch(),
    };
    let splits = batch_splits(effective_batch as u64, pins.micro_batch, pins.accumulation);
    if splits.is_empty() {
        let pinned = |v: Option<u64>| v.map_or("any".to_string(), |v| v.to_string());
        return Err(TrainError::Config(crate::config::ConfigError::Value {
            key: "micro_batch",
            value: format!(
                "{} × accumulation {}",
                pinned(pins.micro_batch),
                pinned(pins.accumulation)
            ),
            reason: format!(
                "no such split of the effective batch of {effective_batch}; pin a divisor of it"
            ),
        }));
    }
    let speed = SpeedModel::measure(calibration_shapes(&spec, seq_len, splits[0].0 as usize))?;
    let mut fitting = Vec::new();
    let mut rejected = Vec::new();
    for tier in combos(&spec, pins) {
        let outcomes = parallel_map(&tier, |combo| {
            largest_fitting(
                &splits,
                |&(micro_batch, accumulation)| {
                    let s = Strategy {
                        micro_batch,
                        accumulation,
                        ..*combo
                    };
                    evaluate(config, corpus, &s, &speed)
                },
                |p| p.fits,
            )
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
    prefer_configured(&mut fitting, &config.strategy);
    Ok(AutoPlan {
        fitting,
        rejected,
        speed,
        effective_batch,
        seq_len,
        has_attention: matches!(spec, headroom_nn::models::ModelSpec::Gpt(_)),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Predicted times closer than this to the fastest count as equal: the speed model's rates move
/// by more than that between runs on a shared machine (docs/benchmarks.md).
pub const SAME_SPEED: f64 = 0.05;

/// Among the plans of the best tier predicted within [`SAME_SPEED`] of the fastest, moves to the
/// front the one that changes the fewest levers of the configured strategy (then the faster), so
/// the choice does not flip between near-equal strategies from run to run.
fn prefer_configured(fitting: &mut [OwnPlan], configured: &Strategy) {
    let Some(best) = fitting.first() else {
        return;
    };
    let (tier, limit) = (best.fidelity_tier, best.time.step_s * (1.0 + SAME_SPEED));
    let changes = |s: &Strategy| changed_levers(s, configured);
    let pick = (0..fitting.len())
        .filter(|&i| fitting[i].fidelity_tier == tier && fitting[i].time.step_s <= limit)
        .min_by_key(|&i| (changes(&fitting[i].strategy), i))
        .unwrap_or(0);
    fitting[..=pick].rotate_right(1);
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
