//! A DeepSpeed `ds_config.json` for a plan (keys of deepspeed/runtime/zero/config.py and
//! offload_config.py; docs/sources.md §8). Bucket sizes are the ones the cost model charged.
//! Activation checkpointing and attention kind are model-side settings in Hugging Face
//! (`gradient_checkpointing_enable()`, `attn_implementation`) and are not part of ds_config.

use crate::cost::{Plan, Problem};
use crate::error::{PlanError, Result};
use crate::strategy::{Offload, Optimizer, Precision};
use serde_json::{Value, json};

/// Builds the ds_config of `plan`.
pub fn ds_config(problem: &Problem, plan: &Plan) -> Result<Value> {
    let s = &plan.strategy;
    let mut cfg = json!({
        "train_batch_size": problem.workload.global_batch,
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.accumulation,
        "gradient_clipping": 1.0,
    });
    match s.precision {
        Precision::Bf16Mixed | Precision::Bf16 => cfg["bf16"] = json!({ "enabled": true }),
        Precision::Fp16Mixed => {
            cfg["fp16"] = json!({
                "enabled": true, "loss_scale": 0, "initial_scale_power": 16,
                "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1
            })
        }
        Precision::Fp32 => {}
    }
    match s.optimizer {
        Optimizer::AdamW => {
            cfg["optimizer"] = json!({
                "type": "AdamW",
                "params": { "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01 }
            })
        }
        Optimizer::Lamb => cfg["optimizer"] = json!({ "type": "Lamb", "params": { "lr": 1e-3 } }),
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
            o["nvme_path"] = json!("/local_nvme");
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
        // Hugging Face's "auto" values: prefetch 0.9·h², persistence threshold 10·h.
        zero["stage3_prefetch_bucket_size"] = json!((0.9 * (h * h) as f64) as u64);
        zero["stage3_param_persistence_threshold"] = json!(10 * h);
        zero["stage3_gather_16bit_weights_on_model_save"] = json!(true);
    }
    cfg["zero_optimization"] = zero;
    Ok(cfg)
}
