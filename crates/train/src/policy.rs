//! Activation-checkpoint policies as `--checkpoint` and the TOML spell them, and what each
//! recomputes: `none`; `all` (every block); `every:K` (blocks 0, K, 2K, …, one in every K);
//! `sqrt` (⌈√n⌉ segments, Chen et al.); `budget:SIZE` (the least recomputation whose activation
//! peak fits SIZE — the exact plan, checked by a dry run on the real allocator); `selective`
//! (inside every block: keep matmul outputs, recompute attention scores, softmax, attention
//! dropout and the GELU).
//!
//! Not for: the planning algorithms (see `recompute`) or the recomputation mechanism (the tensor
//! crate's checkpoint scopes).

use crate::recompute::{Plan, PlanCost, chen, dry_run, optimal_plan};
use headroom_memory::size::{ByteSize, format_bytes};
use headroom_nn::Recompute;
use headroom_nn::models::ModelSpec;
use headroom_tensor::{DType, TensorError};
use std::fmt;
use std::str::FromStr;

/// A checkpoint policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointPolicy {
    None,
    EveryNth(usize),
    Sqrt,
    Budget(u64),
    Selective,
}

impl CheckpointPolicy {
    pub const ACCEPTED: &'static str =
        "none, all, every:K (K ≥ 1), sqrt, budget:SIZE (e.g. budget:64MiB), selective";
}

impl fmt::Display for CheckpointPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointPolicy::None => f.write_str("none"),
            CheckpointPolicy::EveryNth(1) => f.write_str("all"),
            CheckpointPolicy::EveryNth(k) => write!(f, "every:{k}"),
            CheckpointPolicy::Sqrt => f.write_str("sqrt"),
            CheckpointPolicy::Budget(b) => write!(f, "budget:{b}"),
            CheckpointPolicy::Selective => f.write_str("selective"),
        }
    }
}

impl FromStr for CheckpointPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("{why}; accepted: {}", CheckpointPolicy::ACCEPTED);
        Ok(match s {
            "none" => CheckpointPolicy::None,
            "all" => CheckpointPolicy::EveryNth(1),
            "sqrt" => CheckpointPolicy::Sqrt,
            "selective" => CheckpointPolicy::Selective,
            _ => {
                if let Some(k) = s.strip_prefix("every:") {
                    match k.parse::<usize>() {
                        Ok(k) if k >= 1 => CheckpointPolicy::EveryNth(k),
                        _ => return Err(bad(&format!("'{s}': K must be a whole number ≥ 1"))),
                    }
                } else if let Some(size) = s.strip_prefix("budget:") {
                    let b: ByteSize = size
                        .parse()
                        .map_err(|e: headroom_memory::size::SizeError| bad(&e.to_string()))?;
                    CheckpointPolicy::Budget(b.0)
                } else {
                    return Err(bad(&format!("unknown policy '{s}'")));
                }
            }
        })
    }
}

/// The plans a budget was decided between, for logs and the benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetDecision {
    pub budget: u64,
    /// Chen et al.'s Algorithm 3 with its B search: the best searched plan that fits, with its
    /// modelled cost and its dry-run activation peak.
    pub chen: Option<(Plan, PlanCost, u64)>,
    /// The exact least-recompute plan, its modelled cost and its dry-run activation peak.
    pub optimal: (Plan, PlanCost, u64),
}

/// What a policy recomputes for a model of `depth` repeated blocks. `budget:SIZE` measures the
/// model by dry runs on a shape-only device (`spec`, `dtype`, `micro_batch`, `seq_len`) and
/// returns the decision too.
pub fn recompute_for(
    policy: CheckpointPolicy,
    spec: &ModelSpec,
    dtype: DType,
    micro_batch: usize,
    seq_len: usize,
) -> Result<(Recompute, Option<BudgetDecision>), PolicyError> {
    let depth = spec.depth();
    let segments = |plan: Plan| Recompute {
        segments: plan.segments,
        selective: false,
    };
    Ok(match policy {
        CheckpointPolicy::None => (Recompute::none(), None),
        CheckpointPolicy::EveryNth(k) => (segments(Plan::every_kth(depth, k)), None),
        CheckpointPolicy::Sqrt => (segments(Plan::sqrt(depth)), None),
        CheckpointPolicy::Selective => (
            Recompute {
                segments: Vec::new(),
                selective: true,
            },
            None,
        ),
        CheckpointPolicy::Budget(budget) => {
            let decision = decide_budget(budget, spec, dtype, micro_batch, seq_len)?;
            (segments(decision.optimal.0.clone()), Some(decision))
        }
    })
}

/// Why a budget cannot be met or measured.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("checkpoint budget {budget} is too small: even recomputing every block needs {needed} of activations; raise the budget or lower --micro-batch or --seq-len", budget = format_bytes(*.budget), needed = format_bytes(*.needed))]
    BudgetTooSmall { budget: u64, needed: u64 },
    #[error("dry run of the model failed: {0}")]
    DryRun(#[from] TensorError),
}

fn decide_budget(
    budget: u64,
    spec: &ModelSpec,
    dtype: DType,
    micro_batch: usize,
    seq_len: usize,
) -> Result<BudgetDecision, PolicyError> {
    let chain = dry_run::measure_chain(spec, dtype, micro_batch, seq_len)?;
    let measure = |plan: &Plan| {
        dry_run::activation_peak(
            spec,
            dtype,
            micro_batch,
            seq_len,
            &Recompute {
                segments: plan.segments.clone(),
                selective: false,
            },
        )
    };
    let chen = match chen::best_within(&chain, budget) {
        Some(c) => {
            let peak = measure(&c.plan)?;
            Some((c.plan, c.cost, peak))
        }
        None => None,
    };
    // The chain model is calibrated by dry runs but leaves out transient tensors inside a block;
    // if the dry run of the exact plan exceeds the budget, plan again against a target lowered by
    // the excess.
    let mut target = budget;
    for _ in 0..6 {
        let Some((plan, cost)) = optimal_plan(&chain, target) else {
            break;
        };
        let peak = measure(&plan)?;
        if peak <= budget {
            return Ok(BudgetDecision {
                budget,
                chen,
                optimal: (plan, cost, peak),
            });
        }
        target = target.saturating_sub(peak - budget);
    }
    let everything = measure(&Plan::every_block(spec.depth()))?;
    let (plan, cost) = (
        Plan::every_block(spec.depth()),
        chain.evaluate(&Plan::every_block(spec.depth())),
    );
    if everything <= budget {
        return Ok(BudgetDecision {
            budget,
            chen,
            optimal: (plan, cost, everything),
        });
    }
    Err(PolicyError::BudgetTooSmall {
        budget,
        needed: everything,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_from_their_names() {
        assert_eq!(
            "none".parse::<CheckpointPolicy>().unwrap(),
            CheckpointPolicy::None
        );
        assert_eq!(
            "all".parse::<CheckpointPolicy>().unwrap(),
            CheckpointPolicy::EveryNth(1)
        );
        assert_eq!(
            "every:2".parse::<CheckpointPolicy>().unwrap(),
            CheckpointPolicy::EveryNth(2)
        );
        assert_eq!(
            "budget:64MiB".parse::<CheckpointPolicy>().unwrap(),
            CheckpointPolicy::Budget(64 << 20)
        );
        for bad in ["every:0", "budget:lots", "most"] {
            let e = bad.parse::<CheckpointPolicy>().unwrap_err();
            assert!(e.contains("budget:SIZE"), "{e}");
        }
        assert_eq!(CheckpointPolicy::EveryNth(1).to_string(), "all");
    }
}
