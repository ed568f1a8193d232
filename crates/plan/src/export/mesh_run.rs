//! A plan as the mesh frameworks take it (torchtitan, Megatron-LM): the dp × tp × pp layout,
//! the schedule and its micro-batches, the ZeRO stage across dp, the recompute policy and the
//! batch split, from either a mesh plan or a plain data-parallel plan. The levers those
//! frameworks have no key for (offload, optimizers other than AdamW, LoRA, precisions other than
//! bf16 mixed precision, naive attention, budget or √n checkpointing) are refused here, once for
//! both exporters, with the reason.
//!
//! Not for: the keys of either framework (`torchtitan`, `megatron`), or choosing the layout.

use crate::cost::{Plan, Problem};
use crate::error::{PlanError, Result};
use crate::mesh::MeshPlan;
use crate::strategy::{Attention, Checkpoint, Mesh, Offload, Optimizer, Precision, ZeroStage};

/// How much of each layer the run recomputes in backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recompute {
    /// Every activation kept: no checkpointing, or Korthikanti et al.'s selective recompute
    /// with a flash / memory-efficient attention kernel (which never stores the attention
    /// probabilities that selective recompute would drop, so the two keep the same bytes).
    Nothing,
    /// One layer in every `k` recomputed from its input; `k = 1` is full recompute.
    EveryNth(u64),
    /// torchtitan's per-op selective recompute (`selective_ac_option = "op"`): the matmul and
    /// attention outputs kept, the element-wise ops recomputed.
    SelectiveOp,
}

/// The run an export writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshRun {
    pub mesh: Mesh,
    pub zero_stage: ZeroStage,
    pub recompute: Recompute,
    /// Sequences per micro-batch on each data-parallel replica.
    pub micro_batch: u64,
    /// Micro-batches per optimizer step on each replica: the pipeline's m, or gradient
    /// accumulation without a pipeline.
    pub microbatches: u64,
    pub seq_len: u64,
}

impl MeshRun {
    /// Sequences per optimizer step over every replica.
    pub fn global_batch(&self) -> u64 {
        self.mesh.dp * self.microbatches * self.micro_batch
    }

    /// Sequences each data-parallel replica takes per step.
    pub fn local_batch(&self) -> u64 {
        self.microbatches * self.micro_batch
    }

    /// The run of a mesh plan.
    pub fn of_mesh(problem: &Problem, plan: &MeshPlan, format: &str) -> Result<MeshRun> {
        check_precision(plan.precision, format)?;
        Ok(MeshRun {
            mesh: plan.mesh,
            zero_stage: plan.zero_stage,
            recompute: recompute(plan.checkpoint, format)?,
            micro_batch: plan.micro_batch,
            microbatches: plan.mesh.microbatches,
            seq_len: problem.workload.seq_len,
        })
    }

    /// The run of a plain data-parallel plan over `world` GPUs (dp = world, tp = pp = 1).
    pub fn of_plain(problem: &Problem, plan: &Plan, world: u64, format: &str) -> Result<MeshRun> {
        let s = &plan.strategy;
        check_precision(s.precision, format)?;
        if s.optimizer != Optimizer::AdamW {
            return Err(refuse(
                format,
                format!(
                    "the plan uses --optimizer {}, and {format} builds AdamW with fp32 states; pin --optimizer adamw",
                    s.optimizer
                ),
            ));
        }
        let p = &s.placement;
        if [p.offload_optimizer, p.offload_params, p.offload_activations]
            .iter()
            .any(|o| *o != Offload::None)
        {
            return Err(refuse(
                format,
                "the plan offloads to host memory or NVMe, which the exporter does not write for this framework; pin --offload-optimizer none --offload-params none --offload-activations none, or use --emit deepspeed".into(),
            ));
        }
        if problem.workload.lora.is_some() {
            return Err(refuse(
                format,
                "a LoRA fine-tune is not a pre-training job of this framework; use --emit peft with --emit accelerate or deepspeed".into(),
            ));
        }
        if s.optimizer_in_backward {
            return Err(refuse(
                format,
                "the optimizer step in backward has no key in this framework; pin --optimizer-in-backward false".into(),
            ));
        }
        if s.attention != Attention::MemoryEfficient {
            return Err(refuse(
                format,
                "the plan keeps naive attention's probabilities, and this framework runs a fused attention kernel; pin --attention memory-efficient".into(),
            ));
        }
        Ok(MeshRun {
            mesh: Mesh {
                dp: world,
                ..Mesh::default()
            },
            zero_stage: p.zero_stage,
            recompute: recompute(s.checkpoint, format)?,
            micro_batch: s.micro_batch,
            microbatches: s.accumulation,
            seq_len: problem.workload.seq_len,
        })
    }
}

fn refuse(format: &str, reason: String) -> PlanError {
    PlanError::Export {
        format: format.into(),
        reason,
    }
}

fn check_precision(precision: Precision, format: &str) -> Result<()> {
    if precision == Precision::Bf16Mixed {
        return Ok(());
    }
    Err(refuse(
        format,
        format!(
            "the plan runs --precision {precision}; the export writes bf16 compute with fp32 master weights and AdamW states (its mixed precision); pin --precision bf16-mixed"
        ),
    ))
}

fn recompute(checkpoint: Checkpoint, format: &str) -> Result<Recompute> {
    match checkpoint {
        Checkpoint::None | Checkpoint::Selective => Ok(Recompute::Nothing),
        Checkpoint::EveryNth(k) => Ok(Recompute::EveryNth(k)),
        Checkpoint::SelectiveOp => Ok(Recompute::SelectiveOp),
        other => Err(refuse(
            format,
            format!(
                "--checkpoint {other} has no key in this framework (it recomputes every layer, every k-th layer or none); pin --checkpoint all, every:K, selective-op or none"
            ),
        )),
    }
}
