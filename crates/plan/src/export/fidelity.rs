//! What an export costs when the target tool cannot express the plan: the refusals of the
//! exporters, each naming what the tool would do instead and the bytes (or recompute) that
//! costs, computed with the planner's own cost model on the strategy the tool would run.
//!
//! Not for: writing any format (see the sibling modules).

use crate::cost::{Plan, Problem, evaluate, memory};
use crate::error::PlanError;
use crate::strategy::{Checkpoint, Optimizer, Precision, Strategy};
use headroom_memory::{Category, format_bytes};

/// The strategy a tool runs when it cannot keep pure-bf16 states: bf16 mixed precision, i.e.
/// fp32 master weights (4 B/param) and fp32 optimizer states (AdamW 8 B/param).
pub fn mixed_instead_of_pure(s: &Strategy) -> Strategy {
    Strategy {
        precision: Precision::Bf16Mixed,
        optimizer: match s.optimizer {
            Optimizer::AdamWBf16 => Optimizer::AdamW,
            o => o,
        },
        ..*s
    }
}

/// Device bytes per GPU the tool's fp32 master weights and states add over the plan's
/// (master weights and optimizer states are the only model states that differ).
pub fn pure_bf16_extra_bytes(problem: &Problem, plan: &Plan) -> u64 {
    let instead = mixed_instead_of_pure(&plan.strategy);
    memory::model_state_bytes(problem, &instead)
        .saturating_sub(memory::model_state_bytes(problem, &plan.strategy))
}

/// Refusal of a pure-bf16 plan by a tool that keeps fp32 master weights and states.
pub fn refuse_pure_bf16(problem: &Problem, plan: &Plan, format: &str, why: &str) -> PlanError {
    let instead = evaluate(problem, &mixed_instead_of_pure(&plan.strategy));
    let extra = pure_bf16_extra_bytes(problem, plan);
    PlanError::Export {
        format: format.into(),
        reason: format!(
            "the plan keeps pure bf16 (no fp32 master weights, bf16 optimizer states) but {why}; \
             {format} would keep fp32 master weights (4 B/param) and fp32 {} states, {} more per GPU \
             than the plan (peak {}); pin --precision bf16-mixed to plan for what {format} would \
             run",
            instead.strategy.optimizer,
            format_bytes(extra),
            peak_instead(&instead, plan),
        ),
    }
}

/// Refusal of a checkpointing policy a tool can only express as "every block".
pub fn refuse_partial_checkpointing(problem: &Problem, plan: &Plan, format: &str) -> PlanError {
    let s = &plan.strategy;
    let all = evaluate(
        problem,
        &Strategy {
            checkpoint: Checkpoint::ALL_BLOCKS,
            ..*s
        },
    );
    let pct = |p: &Plan| 100.0 * p.time.recompute_flops / p.time.model_flops;
    let act = |p: &Plan| format_bytes(p.memory.breakdown.at_peak[Category::Activation]);
    PlanError::Export {
        format: format.into(),
        reason: format!(
            "--checkpoint {} cannot be expressed: fsdp_activation_checkpointing checkpoints every \
             block (= --checkpoint all), which recomputes +{:.1}% FLOPs instead of +{:.1}% \
             (step {:.2} s instead of {:.2} s) with activations {} instead of {} at the peak; pin \
             --checkpoint all (or none) to export, or apply the policy in the model code",
            s.checkpoint,
            pct(&all),
            pct(plan),
            all.time.step_s,
            plan.time.step_s,
            act(&all),
            act(plan)
        ),
    }
}

/// Refusal of the optimizer step in backward by a tool with no setting for it.
pub fn refuse_step_in_backward(problem: &Problem, plan: &Plan, format: &str) -> PlanError {
    let (instead, extra) = without_lever(
        problem,
        plan,
        Strategy {
            optimizer_in_backward: false,
            ..plan.strategy
        },
    );
    PlanError::Export {
        format: format.into(),
        reason: format!(
            "the plan runs the optimizer step in backward (torchtune's optimizer_in_bwd: True, or \
             PyTorch's register_post_accumulate_grad_hook in the training script), which {format} \
             has no setting for; {format} would keep every gradient until the step, {} more per \
             GPU at the peak ({}); pin --optimizer-in-backward false to plan for what {format} \
             would run",
            format_bytes(extra),
            peak_instead(&instead, plan),
        ),
    }
}

/// Refusal of activation offload by a tool with no setting for it.
pub fn refuse_activation_offload(problem: &Problem, plan: &Plan, format: &str) -> PlanError {
    let (instead, extra) = without_lever(
        problem,
        plan,
        Strategy {
            placement: crate::strategy::Placement {
                offload_activations: crate::strategy::Offload::None,
                ..plan.strategy.placement
            },
            ..plan.strategy
        },
    );
    PlanError::Export {
        format: format.into(),
        reason: format!(
            "the plan keeps the checkpointed blocks' inputs in host memory, which {format} has no \
             setting for (DeepSpeed's activation_checkpointing.cpu_checkpointing and torchtune's \
             enable_activation_offloading have one: --emit deepspeed or torchtune); {format} \
             would keep them on the GPU, {} more per GPU at the peak ({}); pin \
             --offload-activations none to plan for what {format} would run",
            format_bytes(extra),
            peak_instead(&instead, plan),
        ),
    }
}

/// The plan the tool would run instead (`instead`, the lever dropped) and the device bytes it
/// adds at the peak.
fn without_lever(problem: &Problem, plan: &Plan, instead: Strategy) -> (Plan, u64) {
    let instead = evaluate(problem, &instead);
    let extra = instead
        .memory
        .per_device_peak_bytes
        .saturating_sub(plan.memory.per_device_peak_bytes);
    (instead, extra)
}

/// "P instead of Q, which does not fit": the peak the tool would reach against the plan's.
fn peak_instead(instead: &Plan, plan: &Plan) -> String {
    format!(
        "{} instead of {}{}",
        format_bytes(instead.memory.per_device_peak_bytes),
        format_bytes(plan.memory.per_device_peak_bytes),
        if instead.fits {
            ", still within the usable memory"
        } else {
            ", which does not fit"
        }
    )
}
