//! The one search over strategies, with two evaluators: the analytical cost model (any model on
//! any GPU, in microseconds per strategy; see `analytical`) and the dry run of headroom's own
//! engine (exact bytes on the real allocator, milliseconds per strategy; in the train crate).
//! Enumeration, pins, ranking, ties and "the closest miss" exist here once.
//!
//! - Enumeration: the evaluator names the values worth trying on each axis (its [`Space`]); the
//!   search takes their product, keeps the pinned values and drops what cannot run
//!   (`Strategy::incompatibility`).
//! - Evaluation: a cheap evaluator evaluates every strategy. A costly one is searched by
//!   fidelity tier (a tier only when no strategy of the tiers before it fits) and, per
//!   combination of the other levers, only the largest micro-batch that fits is looked for, by
//!   bisection over the splits (memory never grows as the micro-batch shrinks).
//! - Ranking: fidelity tier (plans that keep mixed-precision AdamW semantics first), then
//!   throughput, then fewer bytes communicated (least exposed to the overlap assumption), then
//!   the lower peak, then the larger micro-batch.
//! - Ties: when a configured strategy is given, plans of the best tier predicted within
//!   [`SAME_SPEED`] of the fastest count as equally fast, and the one changing the fewest of the
//!   configured levers is recommended, so the choice does not flip with measurement noise.
//!
//! Not for: explaining the result (see `advice`) or costing a strategy (the evaluators).

use crate::cost::Plan;
use crate::strategy::{
    Attention, Checkpoint, Loss, Optimizer, Pins, Placement, Precision, Strategy, StrategyError,
    changed_levers, largest_fitting,
};
use serde::Serialize;
use std::cmp::Ordering;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

/// The values an evaluator tries on each axis (pins are applied by the search).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Space {
    pub precisions: Vec<Precision>,
    pub optimizers: Vec<Optimizer>,
    pub placements: Vec<Placement>,
    pub checkpoints: Vec<Checkpoint>,
    pub attentions: Vec<Attention>,
    pub losses: Vec<Loss>,
    /// Whether the optimizer step runs in backward.
    pub in_backward: Vec<bool>,
    /// Micro-batch × accumulation splits of the batch per device, largest micro-batch first.
    pub splits: Vec<(u64, u64)>,
}

/// Whether the optimizer step runs in backward: both where one device runs alone, else off.
pub fn in_backward_values(pins: &Pins, world: u64) -> Vec<bool> {
    match (pins.optimizer_in_backward, world) {
        (Some(b), _) => vec![b],
        (None, 1) => vec![false, true],
        (None, _) => vec![false],
    }
}

/// One way of predicting a strategy's memory and time.
pub trait Evaluator: Sync {
    type Error: Send + From<StrategyError>;
    /// The values worth trying on each axis for this model, hardware and batch.
    fn space(&self, pins: &Pins) -> Result<Space, Self::Error>;
    /// The predicted memory and time of `strategy`.
    fn evaluate(&self, strategy: &Strategy) -> Result<Plan, Self::Error>;
    /// Whether evaluations are cheap enough to evaluate every strategy.
    fn exhaustive(&self) -> bool;
    /// Whether a combination is worth evaluating at all (default: every one).
    fn worth_trying(&self, _strategy: &Strategy, _pins: &Pins) -> bool {
        true
    }
}

/// Predicted times closer than this to the fastest count as equal when a configured strategy
/// is given: the engine's measured rates move by more than that between runs on a shared
/// machine (docs/benchmarks.md).
pub const SAME_SPEED: f64 = 0.05;

/// Result of a search.
#[derive(Clone, Debug, Serialize)]
pub struct SearchOutcome {
    /// Strategies evaluated (every call of the evaluator).
    pub evaluated: usize,
    /// Plans that fit, best first.
    pub fitting: Vec<Plan>,
    /// Plans evaluated that do not fit.
    #[serde(skip)]
    pub rejected: Vec<Plan>,
    /// When nothing fits: the plan with the smallest device peak (the closest miss).
    pub closest: Option<Plan>,
}

impl SearchOutcome {
    pub fn recommended(&self) -> Option<&Plan> {
        self.fitting.first()
    }

    /// The fastest plan that did not fit and departs no further from AdamW than the
    /// recommended one, when it is faster than the recommendation.
    pub fn faster_over_budget(&self) -> Option<&Plan> {
        let best = self.recommended()?;
        self.rejected
            .iter()
            .filter(|p| p.fidelity_tier <= best.fidelity_tier && p.time.step_s < best.time.step_s)
            .min_by(|a, b| by(a.time.step_s, b.time.step_s))
    }

    /// Whether the recommendation is the fastest plan that fits (not one preferred among
    /// near-equals for being closer to the configuration).
    pub fn recommends_the_fastest(&self) -> bool {
        let fastest = self
            .fitting
            .iter()
            .map(|p| p.time.step_s)
            .fold(f64::INFINITY, f64::min);
        self.recommended().is_some_and(|b| b.time.step_s <= fastest)
    }
}

fn by(a: f64, b: f64) -> Ordering {
    a.partial_cmp(&b).unwrap_or(Ordering::Equal)
}

/// Orders fitting plans (see the module header).
pub fn rank(a: &Plan, b: &Plan) -> Ordering {
    a.fidelity_tier
        .cmp(&b.fidelity_tier)
        .then(by(b.time.tokens_per_s, a.time.tokens_per_s))
        .then(by(
            a.time.communication_bytes_per_device,
            b.time.communication_bytes_per_device,
        ))
        .then(
            a.memory
                .per_device_peak_bytes
                .cmp(&b.memory.per_device_peak_bytes),
        )
        .then(b.strategy.micro_batch.cmp(&a.strategy.micro_batch))
}

/// Every combination of the space's axes (splits left at 1 × 1) that keeps the pins, can run
/// and is worth trying, in the order of the axes.
pub fn combinations<E: Evaluator>(
    evaluator: &E,
    space: &Space,
    pins: &Pins,
) -> Result<Vec<Strategy>, StrategyError> {
    let mut out = Vec::new();
    let mut first_incompatibility = None;
    let product = space.precisions.iter().flat_map(|&precision| {
        space.optimizers.iter().flat_map(move |&optimizer| {
            space.placements.iter().flat_map(move |&placement| {
                space.checkpoints.iter().flat_map(move |&checkpoint| {
                    space.attentions.iter().flat_map(move |&attention| {
                        space.losses.iter().flat_map(move |&loss| {
                            space.in_backward.iter().map(move |&in_backward| Strategy {
                                precision,
                                optimizer,
                                placement,
                                checkpoint,
                                attention,
                                loss,
                                optimizer_in_backward: in_backward,
                                micro_batch: 1,
                                accumulation: 1,
                            })
                        })
                    })
                })
            })
        })
    });
    let levers = Pins {
        micro_batch: None,
        accumulation: None,
        ..*pins
    };
    for s in product {
        if !levers.allow(&s) || !evaluator.worth_trying(&s, pins) {
            continue;
        }
        match s.incompatibility() {
            None => out.push(s),
            Some(why) => {
                first_incompatibility.get_or_insert(why);
            }
        }
    }
    if out.is_empty() {
        return Err(StrategyError::Incompatible(
            first_incompatibility.unwrap_or_else(|| "the pinned values leave no strategy".into()),
        ));
    }
    Ok(out)
}

/// Every strategy the search would consider: the combinations × the splits.
pub fn strategies<E: Evaluator>(evaluator: &E, pins: &Pins) -> Result<Vec<Strategy>, E::Error> {
    let space = evaluator.space(pins)?;
    let combos = combinations(evaluator, &space, pins)?;
    Ok(combos
        .iter()
        .flat_map(|c| {
            splits_for(c, &space.splits)
                .into_iter()
                .map(|split| with_split(c, &split))
        })
        .collect())
}

/// The splits `combo` can run with: all of them, or the one without accumulation when the
/// optimizer step runs in backward.
fn splits_for(combo: &Strategy, splits: &[(u64, u64)]) -> Vec<(u64, u64)> {
    splits
        .iter()
        .copied()
        .filter(|&(_, accumulation)| !combo.optimizer_in_backward || accumulation == 1)
        .collect()
}

fn with_split(combo: &Strategy, &(micro_batch, accumulation): &(u64, u64)) -> Strategy {
    Strategy {
        micro_batch,
        accumulation,
        ..*combo
    }
}

/// `combos` grouped by fidelity tier, best tier first, each in the combinations' order.
fn by_tier(combos: Vec<Strategy>) -> Vec<Vec<Strategy>> {
    let mut tiers: Vec<Vec<Strategy>> = Vec::new();
    for s in combos {
        let tier = usize::from(s.fidelity_tier());
        if tiers.len() <= tier {
            tiers.resize(tier + 1, Vec::new());
        }
        tiers[tier].push(s);
    }
    tiers.retain(|t| !t.is_empty());
    tiers
}

/// Enumerates, evaluates and ranks; `configured` (the strategy a user configured) settles near
/// ties in its favour.
pub fn search<E: Evaluator>(
    evaluator: &E,
    pins: &Pins,
    configured: Option<&Strategy>,
) -> Result<SearchOutcome, E::Error> {
    let space = evaluator.space(pins)?;
    let combos = combinations(evaluator, &space, pins)?;
    let evaluations = AtomicUsize::new(0);
    let evaluate = |s: &Strategy| {
        evaluations.fetch_add(1, AtomicOrdering::Relaxed);
        evaluator.evaluate(s)
    };
    let mut fitting = Vec::new();
    let mut rejected = Vec::new();
    if evaluator.exhaustive() {
        for combo in &combos {
            for split in &splits_for(combo, &space.splits) {
                let plan = evaluate(&with_split(combo, split))?;
                if plan.fits {
                    fitting.push(plan);
                } else {
                    rejected.push(plan);
                }
            }
        }
    } else {
        for tier in by_tier(combos) {
            let outcomes = parallel_map(&tier, |combo| {
                largest_fitting(
                    &splits_for(combo, &space.splits),
                    |split| evaluate(&with_split(combo, split)),
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
    }
    fitting.sort_by(rank);
    if let Some(c) = configured {
        prefer_configured(&mut fitting, c);
    }
    let closest = if fitting.is_empty() {
        rejected
            .iter()
            .min_by_key(|p| p.memory.per_device_peak_bytes)
            .cloned()
    } else {
        None
    };
    Ok(SearchOutcome {
        evaluated: evaluations.into_inner(),
        fitting,
        rejected,
        closest,
    })
}

/// Among the plans of the best tier predicted within [`SAME_SPEED`] of the fastest, moves to the
/// front the one that changes the fewest levers of the configured strategy (then the faster).
fn prefer_configured(fitting: &mut [Plan], configured: &Strategy) {
    let Some(best) = fitting.first() else {
        return;
    };
    let (tier, limit) = (best.fidelity_tier, best.time.step_s * (1.0 + SAME_SPEED));
    let pick = (0..fitting.len())
        .filter(|&i| fitting[i].fidelity_tier == tier && fitting[i].time.step_s <= limit)
        .min_by_key(|&i| (changed_levers(&fitting[i].strategy, configured), i))
        .unwrap_or(0);
    fitting[..=pick].rotate_right(1);
}

/// `f` over `items` on all cores, results in the items' order (dry runs are independent: each
/// has its own shape-only device).
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
