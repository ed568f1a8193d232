//! The lever settings `headroom plan --trace` traces: one `Variant` per precision, checkpoint
//! policy, micro-batch, AdamW implementation and (on several GPUs) ZeRO stage, as the planner
//! names it and as `headroom.trace` takes it, and the plain configuration they are compared with.
//!
//! Not for: tracing them (`plan_trace_sweep`) or ranking them (`plan_trace`).

use super::plan_args::PlanArgs;
use anyhow::{Result, bail};
use headroom_plan::strategy::{
    Attention, Checkpoint, OptimizerImpl, Placement, Precision, Strategy, ZeroStage, changed_levers,
};

/// One lever setting, as the planner names it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Variant {
    pub precision: Precision,
    pub checkpoint: Checkpoint,
    pub micro_batch: u64,
    pub accumulation: u64,
    pub optimizer_impl: OptimizerImpl,
    /// SDPA (memory-efficient: the tracer emulates its flash and memory-efficient CUDA
    /// kernels) or transformers' eager attention (naive: scores and probabilities as tensors).
    pub attention: Attention,
    /// Ranks of the FSDP2 run traced (1: one GPU, no sharding) and its ZeRO stage: 3 reshards
    /// each unit after its forward, 2 keeps it gathered until its backward.
    pub ranks: u64,
    pub zero: ZeroStage,
}

impl Variant {
    /// The strategy the speed model times: PyTorch's AdamW, the variant's ZeRO stage and
    /// attention, Hugging Face's loss.
    pub fn strategy(&self, has_attention: bool) -> Strategy {
        Strategy {
            precision: self.precision,
            placement: Placement {
                zero_stage: self.zero,
                ..Placement::default()
            },
            checkpoint: self.checkpoint,
            attention: if has_attention {
                self.attention
            } else {
                Attention::Naive
            },
            micro_batch: self.micro_batch,
            accumulation: self.accumulation,
            ..Strategy::default()
        }
    }

    /// The settings `headroom.trace` takes for this variant.
    pub fn tracer_settings(&self, lora: Option<(usize, f32)>) -> serde_json::Value {
        let mut v = serde_json::json!({
            "dtype": match self.precision {
                Precision::Bf16Mixed => "bf16-autocast",
                Precision::Fp16Mixed => "fp16-autocast",
                Precision::Bf16 => "bf16",
                _ => "fp32",
            },
            "micro_batch": self.micro_batch,
            "optimizer_impl": match self.optimizer_impl {
                OptimizerImpl::Foreach => "foreach",
                OptimizerImpl::Fused => "fused",
                OptimizerImpl::PerTensor => "for-loop",
            },
            // True for every block, K for one block in K (`--checkpoint every:K`), and
            // torchtitan's per-operator policy on every block (`--checkpoint selective-op`).
            "gradient_checkpointing": match self.checkpoint {
                Checkpoint::EveryNth(k) if k > 1 => serde_json::json!(k),
                Checkpoint::SelectiveOp => serde_json::json!("selective-op"),
                c => serde_json::json!(c != Checkpoint::None),
            },
            "attention": match self.attention {
                Attention::MemoryEfficient => "sdpa",
                Attention::Naive => "eager",
            },
        });
        if let Some((rank, alpha)) = lora {
            v["lora_rank"] = rank.into();
            v["lora_alpha"] = alpha.into();
        }
        if self.ranks > 1 && self.zero.number() == 0 {
            v["ddp"] = true.into();
        } else if self.ranks > 1 {
            v["fsdp"] = self.ranks.into();
            v["reshard_after_forward"] = self.zero.shards_parameters().into();
        }
        v
    }

    /// Levers changed from `configured`: the strategy's, and the optimizer's implementation.
    pub(super) fn changes(&self, configured: &Variant) -> usize {
        changed_levers(&self.strategy(true), &configured.strategy(true))
            + usize::from(self.optimizer_impl != configured.optimizer_impl)
    }
}

/// The settings to trace on `ranks` GPUs, and the plain configuration they are compared with:
/// the pinned levers kept, the others searched.
pub fn variants(args: &PlanArgs, global: u64, ranks: u64) -> Result<(Vec<Variant>, Variant)> {
    let pins = args.levers.pins();
    if !global.is_multiple_of(ranks) {
        bail!(
            "the global batch of {global} samples does not split over {ranks} GPUs; give a multiple of {ranks}"
        );
    }
    let per_rank = global / ranks;
    let zeros = match (ranks, pins.zero_stage) {
        (1, None) => vec![ZeroStage::default()],
        (1, Some(z)) if z.number() == 0 => vec![z],
        (1, Some(z)) => bail!(
            "--zero {} shards over data-parallel ranks; --trace plans one GPU here (give --gpus-per-node N to trace rank 0 of an FSDP2 run)",
            z.number()
        ),
        (_, None) => vec![ZeroStage::new(3)?, ZeroStage::new(2)?, ZeroStage::new(0)?],
        (_, Some(z)) if z.number() != 1 => vec![z],
        (_, Some(_)) => bail!(
            "--zero 1 is not traced on several GPUs yet (PyTorch's ZeroRedundancyOptimizer is not traced); accepted with --trace: --zero 0 (DDP), 2 or 3 (FSDP2 without or with resharding after forward)"
        ),
    };
    let precisions = match pins.precision {
        None => vec![
            Precision::Fp32,
            Precision::Bf16Mixed,
            Precision::Fp16Mixed,
            Precision::Bf16,
        ],
        Some(p) => vec![p],
    };
    let checkpoints = match pins.checkpoint {
        None => vec![Checkpoint::None, Checkpoint::ALL_BLOCKS],
        Some(c @ (Checkpoint::None | Checkpoint::EveryNth(_) | Checkpoint::SelectiveOp)) => vec![c],
        Some(c) => bail!(
            "--checkpoint {c} is not traced yet; accepted with --trace: none, all (Hugging Face's gradient checkpointing of every block), every:K (one block in K), selective-op (torchtitan's per-operator policy on every block)"
        ),
    };
    let micro_batches: Vec<u64> = match pins.micro_batch {
        Some(m) if m == 0 || !per_rank.is_multiple_of(m) => {
            bail!("--micro-batch {m} does not divide the {per_rank} samples per GPU")
        }
        Some(m) => vec![m],
        None => (0..u64::BITS)
            .map(|k| 1u64 << k)
            .take_while(|&m| m <= per_rank)
            .filter(|&m| per_rank.is_multiple_of(m))
            .collect(),
    };
    // SDPA is transformers' default and the better of the two on every count; eager attention
    // is traced when asked for (`--attention naive`), to see what a program that uses it costs.
    let attention = pins.attention.unwrap_or(Attention::MemoryEfficient);
    let impls = match args.optimizer_impl {
        Some(i) => vec![i],
        None => vec![
            OptimizerImpl::Foreach,
            OptimizerImpl::Fused,
            OptimizerImpl::PerTensor,
        ],
    };
    let mut out = Vec::new();
    for &zero in &zeros {
        for &precision in &precisions {
            for &checkpoint in &checkpoints {
                for &micro_batch in micro_batches.iter().rev() {
                    for &optimizer_impl in &impls {
                        out.push(Variant {
                            precision,
                            checkpoint,
                            micro_batch,
                            accumulation: per_rank / micro_batch,
                            optimizer_impl,
                            attention,
                            ranks,
                            zero,
                        });
                    }
                }
            }
        }
    }
    let largest = *micro_batches.last().unwrap_or(&1);
    let configured = Variant {
        precision: pins.precision.unwrap_or(Precision::Fp32),
        checkpoint: pins.checkpoint.unwrap_or(Checkpoint::None),
        micro_batch: largest,
        accumulation: per_rank / largest,
        optimizer_impl: args.optimizer_impl.unwrap_or_default(),
        attention,
        ranks,
        // FSDP's default is full sharding.
        zero: zeros[0],
    };
    Ok((out, configured))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_checkpoint_policy_is_traced_as_the_tracer_names_it() {
        let v = |checkpoint| Variant {
            precision: Precision::Fp32,
            checkpoint,
            micro_batch: 1,
            accumulation: 1,
            optimizer_impl: OptimizerImpl::Foreach,
            attention: Attention::MemoryEfficient,
            ranks: 1,
            zero: ZeroStage::default(),
        };
        let setting = |c| v(c).tracer_settings(None)["gradient_checkpointing"].clone();
        assert_eq!(setting(Checkpoint::EveryNth(3)), serde_json::json!(3));
        assert_eq!(setting(Checkpoint::ALL_BLOCKS), serde_json::json!(true));
        assert_eq!(setting(Checkpoint::None), serde_json::json!(false));
        assert_eq!(
            setting(Checkpoint::SelectiveOp),
            serde_json::json!("selective-op")
        );
    }

    #[test]
    fn tracer_settings_name_the_tracer_values() {
        let v = Variant {
            precision: Precision::Bf16Mixed,
            checkpoint: Checkpoint::ALL_BLOCKS,
            micro_batch: 4,
            accumulation: 2,
            optimizer_impl: OptimizerImpl::PerTensor,
            attention: Attention::Naive,
            ranks: 1,
            zero: ZeroStage::default(),
        };
        assert_eq!(
            v.tracer_settings(Some((8, 16.0))),
            serde_json::json!({
                "dtype": "bf16-autocast", "micro_batch": 4, "optimizer_impl": "for-loop",
                "gradient_checkpointing": true, "attention": "eager", "lora_rank": 8,
                "lora_alpha": 16.0,
            })
        );
        // One rank of DDP at ZeRO-0.
        let ddp = Variant {
            ranks: 4,
            zero: ZeroStage::default(),
            ..v
        }
        .tracer_settings(None);
        assert_eq!(ddp["ddp"], serde_json::json!(true));
        assert!(ddp.get("fsdp").is_none());
        // Rank 0 of an FSDP2 run: ZeRO-3 reshards after forward, ZeRO-2 does not.
        for (zero, reshard) in [(3, true), (2, false)] {
            let fsdp = Variant {
                ranks: 4,
                zero: ZeroStage::new(zero).unwrap(),
                ..v
            };
            let settings = fsdp.tracer_settings(None);
            assert_eq!(settings["fsdp"], serde_json::json!(4));
            assert_eq!(
                settings["reshard_after_forward"],
                serde_json::json!(reshard)
            );
        }
    }
}
