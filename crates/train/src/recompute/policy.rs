//! What each activation-checkpoint policy (the vocabulary's `Checkpoint`) recomputes: `none`; `all` (every block); `every:K` (blocks 0, K, 2K, …, one in every K);
//! `sqrt` (⌈√n⌉ segments, Chen et al.); `budget:SIZE` (the least recomputation whose activation
//! peak fits SIZE — the exact plan, checked by a dry run on the real allocator); `selective`
//! (inside every block: keep matmul outputs, recompute attention scores, softmax, attention
//! dropout and the GELU).
//!
//! Not for: the planning algorithms (see `recompute`) or the recomputation mechanism (the tensor
//! crate's checkpoint scopes).

use crate::recompute::{Plan, PlanCost, chen, dry_run, optimal_plan};
use headroom_memory::size::format_bytes;
use headroom_nn::Recompute;
use headroom_nn::models::ModelSpec;
use headroom_strategy::{Checkpoint, Loss};
use headroom_tensor::{DType, TensorError};

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

/// What a policy recomputes for a model of `depth` repeated blocks, with the loss computed as
/// `loss` (a chunked loss recomputes each chunk's logits). `budget:SIZE` measures the model by
/// dry runs on a shape-only device (`spec`, `dtype`, `micro_batch`, `seq_len`) and returns the
/// decision too.
pub fn recompute_for(
    policy: Checkpoint,
    loss: Loss,
    spec: &ModelSpec,
    dtype: DType,
    micro_batch: usize,
    seq_len: usize,
) -> Result<(Recompute, Option<BudgetDecision>), PolicyError> {
    let depth = spec.depth();
    let loss_chunks = loss.chunks() as usize;
    let segments = |plan: Plan| Recompute {
        segments: plan.segments,
        selective: false,
        loss_chunks,
    };
    Ok(match policy {
        Checkpoint::None => (segments(Plan::none()), None),
        Checkpoint::EveryNth(k) => (segments(Plan::every_kth(depth, k as usize)), None),
        Checkpoint::Sqrt => (segments(Plan::sqrt(depth)), None),
        Checkpoint::Selective => (
            Recompute {
                segments: Vec::new(),
                selective: true,
                loss_chunks,
            },
            None,
        ),
        Checkpoint::SelectiveOp => return Err(PolicyError::PlannerOnly),
        Checkpoint::Budget(budget) => {
            let shape = (micro_batch, seq_len);
            let decision = decide_budget(budget, loss_chunks, spec, dtype, shape)?;
            (segments(decision.optimal.0.clone()), Some(decision))
        }
    })
}

/// Why a budget cannot be met or measured.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("checkpoint budget {budget} is too small: even recomputing every block needs {needed} of activations; raise the budget or lower --micro-batch or --seq-len", budget = format_bytes(*.budget), needed = format_bytes(*.needed))]
    BudgetTooSmall { budget: u64, needed: u64 },
    #[error(
        "--checkpoint selective-op is torchtitan's per-operator policy, which `headroom plan` predicts for Hugging Face models but headroom's engine does not run; accepted here: none, all, every:K, sqrt, budget:SIZE, selective"
    )]
    PlannerOnly,
    #[error("dry run of the model failed: {0}")]
    DryRun(#[from] TensorError),
}

fn decide_budget(
    budget: u64,
    loss_chunks: usize,
    spec: &ModelSpec,
    dtype: DType,
    (micro_batch, seq_len): (usize, usize),
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
                loss_chunks,
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
