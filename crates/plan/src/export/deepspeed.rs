//! A DeepSpeed `ds_config.json` for a plan (keys of deepspeed.ai/docs/config-json and of
//! deepspeed/runtime/zero/config.py and offload_config.py; docs/sources.md §8), written for the
//! Hugging Face Trainer's DeepSpeed integration (huggingface.co/docs/transformers/deepspeed):
//! the training hyper-parameters the integration fills from `TrainingArguments` are `"auto"`;
//! the batch split and the precision, which decide the memory, are explicit, and the integration
//! refuses to start when `TrainingArguments` disagree with them. Bucket sizes are the ones the
//! cost model charged. Pure bf16 uses the `bf16` section's `bf16_master_weights_and_grads` and
//! `bf16_optimizer_states` (DeepSpeed PR #7700, blogs/core_api_update), which DeepSpeed accepts
//! with ZeRO stage 1–3 only; at stage 0 the export is refused with the cost of fp32 states.
//! Activation checkpointing, attention kind and a chunked loss are model-side settings in
//! Hugging Face (`gradient_checkpointing_enable()`, `attn_implementation`, Liger Kernel's fused
//! linear cross-entropy through `use_liger_kernel=True`) and are not part of ds_config.
//! Activation offload is: `activation_checkpointing.cpu_checkpointing`, which acts on models
//! that checkpoint through `deepspeed.checkpointing` (Megatron-DeepSpeed, the ZeRO-Offload
//! tutorial's GPT-2); a Hugging Face model checkpointing through `torch.utils.checkpoint` keeps
//! its inputs on the GPU whatever the section says.

use super::{ExportOptions, fidelity, hold_to_rules, rules};
use crate::cost::gather;
use crate::cost::{Plan, Problem};
use crate::error::{PlanError, Result};
use crate::strategy::{Framework, Offload, Optimizer, Precision};
use serde_json::{Value, json};

/// Builds the ds_config of `plan`.
pub fn ds_config(problem: &Problem, plan: &Plan, opts: &ExportOptions) -> Result<Value> {
    let s = &plan.strategy;
    if problem.framework != Framework::DeepSpeed {
        return Err(PlanError::Export {
            format: "deepspeed".into(),
            reason: format!(
                "the plan predicts {}'s memory layout (fp32 parameters as the master copy, whole \
                 blocks gathered), not DeepSpeed's; plan with --framework deepspeed to export a \
                 ds_config",
                problem.framework
            ),
        });
    }
    if s.optimizer_in_backward {
        return Err(fidelity::refuse_step_in_backward(
            problem,
            plan,
            "deepspeed",
        ));
    }
    let mut cfg = json!({
        "train_batch_size": problem.workload.global_batch,
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.accumulation,
        // TrainingArguments.max_grad_norm.
        "gradient_clipping": "auto",
    });
    match s.precision {
        Precision::Bf16Mixed => cfg["bf16"] = json!({ "enabled": true }),
        Precision::Bf16 => {
            if !s.placement.zero_stage.shards_optimizer() {
                return Err(fidelity::refuse_pure_bf16(
                    problem,
                    plan,
                    "deepspeed",
                    "DeepSpeed keeps master weights and optimizer states in bf16 \
                     (bf16_master_weights_and_grads, bf16_optimizer_states) only under ZeRO stage \
                     1–3 and the plan is ZeRO-0; pin --zero 1 or higher",
                ));
            }
            cfg["bf16"] = json!({
                "enabled": true,
                "bf16_master_weights_and_grads": true,
                "bf16_optimizer_states": true,
            })
        }
        Precision::Fp16Mixed => {
            cfg["fp16"] = json!({
                "enabled": true, "loss_scale": 0, "initial_scale_power": 16,
                "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1
            })
        }
        Precision::Fp32 => {}
    }
    let auto_params =
        json!({ "lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto" });
    match s.optimizer {
        // Pure bf16 with bf16_optimizer_states keeps AdamW's states in bf16 (adamw-bf16's).
        Optimizer::AdamW => cfg["optimizer"] = json!({ "type": "AdamW", "params": auto_params }),
        Optimizer::AdamWBf16 if s.precision == Precision::Bf16 => {
            cfg["optimizer"] = json!({ "type": "AdamW", "params": auto_params })
        }
        Optimizer::Lamb => {
            cfg["optimizer"] =
                json!({ "type": "Lamb", "params": { "lr": "auto", "weight_decay": "auto" } })
        }
        Optimizer::AdamW8bit => {
            return Err(PlanError::Export {
                format: "deepspeed".into(),
                reason: "DeepSpeed has no 8-bit optimizer type; pass bitsandbytes' AdamW8bit as a client optimizer (deepspeed.initialize(optimizer=bitsandbytes.optim.AdamW8bit(...))), or with Hugging Face Trainer use --optim adamw_bnb_8bit and drop \"optimizer\" from the config; or pin --optimizer adamw".into(),
            });
        }
        Optimizer::PagedAdamW8bit => {
            return Err(PlanError::Export {
                format: "deepspeed".into(),
                reason: "DeepSpeed has no paged optimizer type; pass bitsandbytes' PagedAdamW8bit as a client optimizer (deepspeed.initialize(optimizer=bitsandbytes.optim.PagedAdamW8bit(...))), or with Hugging Face Trainer use --optim paged_adamw_8bit and drop \"optimizer\" from the config; or pin --optimizer adamw".into(),
            });
        }
        other => {
            return Err(PlanError::Export {
                format: "deepspeed".into(),
                reason: format!(
                    "optimizer {other} has no DeepSpeed config type; pass it as a client optimizer or pin --optimizer adamw"
                ),
            });
        }
    }
    let bucket = problem.cost.bucket_elements;
    let mut zero = json!({
        "stage": s.placement.zero_stage,
        "contiguous_gradients": true,
        "overlap_comm": s.placement.zero_stage.shards_parameters(),
        "reduce_scatter": true,
        "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket,
    });
    let offload = |device: Offload| {
        let mut o = json!({ "device": device.name(), "pin_memory": true });
        if device == Offload::Nvme {
            o["nvme_path"] = json!(opts.nvme_path);
        }
        o
    };
    if s.placement.offload_optimizer != Offload::None {
        zero["offload_optimizer"] = offload(s.placement.offload_optimizer);
        zero["sub_group_size"] = json!(100_000_000u64);
    }
    if s.placement.offload_params != Offload::None {
        zero["offload_param"] = offload(s.placement.offload_params);
    }
    if s.placement.zero_stage.shards_parameters() {
        let h = problem.spec.hidden_size;
        // The gathering the plan charged (`cost::gather`): Hugging Face's "auto" prefetch
        // 0.9·h² and persistence threshold 10·h, DeepSpeed's default live-parameter cap.
        zero["stage3_prefetch_bucket_size"] = json!(gather::deepspeed_prefetch_bucket(h));
        zero["stage3_param_persistence_threshold"] =
            json!(gather::deepspeed_persistence_threshold(h));
        zero["stage3_max_live_parameters"] = json!(gather::DEEPSPEED_MAX_LIVE_PARAMETERS);
        zero["stage3_gather_16bit_weights_on_model_save"] = json!(true);
    }
    cfg["zero_optimization"] = zero;
    if s.placement.offload_activations.is_offloaded() {
        cfg["activation_checkpointing"] = json!({
            "partition_activations": false,
            "cpu_checkpointing": true,
            "contiguous_memory_optimization": false,
        });
    }
    hold_to_rules("deepspeed", rules::deepspeed(&cfg))?;
    Ok(cfg)
}
