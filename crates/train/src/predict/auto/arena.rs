//! The planned arena as a lever of `--auto`: the search dry-runs every strategy on the
//! configured (caching) allocator, whose reserved peak is the live bytes plus the pools' cached
//! and split blocks; the arena reserves the live peak itself (docs/fine-tuning.md, "A planned
//! arena"). A plan the search rejected whose live peak fits the budget may therefore fit on the
//! arena, and when it is faster than the search's best by more than [`SAME_SPEED`] (or nothing
//! else fits, or it has a better fidelity tier) it is worth the arena. The arena changes where
//! tensors live, not what is computed, so a rejected plan's predicted speed holds; only its
//! memory needs a dry run on the arena, tried in order of preference until one fits.
//!
//! Not for: the arena itself (`headroom_memory::arena`) or the search (the planner's `search`).

use super::evaluator::evaluate;
use super::speed::SpeedModel;
use crate::config::RunConfig;
use crate::data::Corpus;
use crate::predict::Prediction;
use crate::trainer::TrainError;
use headroom_memory::AllocatorKind;
use headroom_plan::cost::Plan;
use headroom_plan::search::{SAME_SPEED, SearchOutcome};
use headroom_strategy::Strategy;

/// Dry runs on the arena at most, each a recording and a counted run.
pub const MAX_ARENA_TRIES: usize = 12;

/// A plan that fits only on the arena, and what it replaced.
#[derive(Debug)]
pub struct Rescued {
    /// The dry run of the plan on the arena.
    pub prediction: Prediction,
    /// The caching allocator's best plan it beat (none fitted there).
    pub instead_of: Option<Plan>,
    pub plan: Plan,
}

impl Rescued {
    /// One line for the search's reason.
    pub fn reason(&self, has_attention: bool) -> String {
        let caching = match &self.instead_of {
            Some(p) => format!(
                "on the caching allocator the best is {} at {:.0} tokens/s",
                p.strategy.describe(has_attention),
                p.time.tokens_per_s
            ),
            None => "on the caching allocator nothing fits".to_string(),
        };
        format!(
            "allocator: the planned arena (--allocator planned), which reserves the live peak of \
             {} where the caching pools' overhead takes it over the budget; {caching}",
            headroom_memory::format_bytes(self.plan.memory.per_device_peak_bytes)
        )
    }
}

/// Whether `candidate` (rejected on the caching allocator) would beat `best` (the search's
/// recommendation, if any): a better fidelity tier, or the same tier and faster by more than
/// [`SAME_SPEED`].
fn worth_the_arena(candidate: &Plan, best: Option<&Plan>) -> bool {
    match best {
        None => true,
        Some(b) => {
            candidate.fidelity_tier < b.fidelity_tier
                || (candidate.fidelity_tier == b.fidelity_tier
                    && candidate.time.step_s * (1.0 + SAME_SPEED) < b.time.step_s)
        }
    }
}

/// Retries on the arena the rejected plans of `outcome` whose live peak (`peak_live`, from
/// their caching dry run) fits the budget and that would beat its recommendation, best tier
/// then fastest first; the first that fits becomes the recommendation (moved to the front of
/// the fitting plans and out of the rejected ones).
pub fn rescue(
    config: &RunConfig,
    corpus: &Corpus,
    speed: &SpeedModel,
    outcome: &mut SearchOutcome,
    peak_live: impl Fn(&Strategy) -> u64,
) -> Result<Option<Rescued>, TrainError> {
    let best = outcome.recommended().cloned();
    let mut candidates: Vec<&Plan> = outcome
        .rejected
        .iter()
        .filter(|p| worth_the_arena(p, best.as_ref()))
        .filter(|p| peak_live(&p.strategy) <= config.device_memory)
        .collect();
    candidates.sort_by(|a, b| {
        a.fidelity_tier
            .cmp(&b.fidelity_tier)
            .then(a.time.step_s.total_cmp(&b.time.step_s))
    });
    let arena = RunConfig {
        allocator: AllocatorKind::Planned,
        ..config.clone()
    };
    let tries: Vec<Strategy> = candidates
        .iter()
        .take(MAX_ARENA_TRIES)
        .map(|p| p.strategy)
        .collect();
    for strategy in tries {
        outcome.evaluated += 1;
        let (plan, prediction) = evaluate(&arena, corpus, &strategy, speed)?;
        if plan.fits {
            outcome.rejected.retain(|p| p.strategy != strategy);
            outcome.fitting.insert(0, plan.clone());
            outcome.closest = None;
            return Ok(Some(Rescued {
                prediction,
                instead_of: best,
                plan,
            }));
        }
    }
    Ok(None)
}
