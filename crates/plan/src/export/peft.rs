//! The LoRA settings of a plan in the formats the Hugging Face stack reads: PEFT's
//! `adapter_config.json` (what `LoraConfig.save_pretrained` writes and
//! `LoraConfig.from_pretrained` reads) and, for a QLoRA plan, the `quantization_config` of
//! Transformers' `BitsAndBytesConfig` (`to_dict()`'s keys). Target modules are named as the
//! model's own modules are (`q_proj`, GPT-2's `c_attn`), by the shortest suffix of the module
//! path that names no other module of the block (GPT-2's attention output is `attn.c_proj`,
//! its MLP's `mlp.c_proj`). `base_model_name_or_path` is what `from_pretrained` loads: the Hub
//! id of a built-in model, else the directory of the given `config.json`. Under FSDP the 4-bit
//! weights are stored in the model's dtype (`bnb_4bit_quant_storage`), as PEFT's FSDP-QLoRA
//! guide loads them; that dtype is written on one GPU too, where it only packs the same bytes.
//!
//! Not for: the trainer's own settings (batch, precision, optimizer: the DeepSpeed and
//! Accelerate exports, or `headroom train`'s TOML).

use super::{hold_to_rules, rules};
use crate::cost::{Plan, Problem};
use crate::error::{PlanError, Result};
use crate::model::LoraCounts;
use crate::model::lora::adapted_modules;
use crate::model::presets::hub_id_of_preset;
use crate::strategy::{BaseWeights, Lora, Precision};
use serde_json::{Value, json};
use std::path::Path;

fn lora_of(problem: &Problem) -> Result<&Lora> {
    problem.workload.lora.as_ref().ok_or_else(|| {
        PlanError::Incompatible(
            "the plan is not a LoRA fine-tune, so PEFT and bitsandbytes have nothing to configure: add --lora-rank R (and --lora-targets)"
                .into(),
        )
    })
}

/// The model `from_pretrained` loads: a built-in model's Hub id, else the directory the
/// `config.json` was read from (the model name itself when it names a directory).
pub fn base_model_name_or_path(model: &str) -> String {
    if let Some(id) = hub_id_of_preset(model) {
        return id.to_string();
    }
    let path = Path::new(model);
    if path.is_dir() {
        return model.to_string();
    }
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.display().to_string(),
        _ => ".".to_string(),
    }
}

/// PEFT's `adapter_config.json` for the plan's adapters.
pub fn adapter_config(problem: &Problem) -> Result<Value> {
    let lora = lora_of(problem)?;
    let inv = crate::model::ParamInventory::of(&problem.spec);
    debug_assert!(LoraCounts::of(&inv, lora).is_some());
    // The planned dropout as its decimal reads (f32 0.1 widened would write 0.10000000149...).
    let dropout: f64 = problem
        .workload
        .lora_dropout
        .map_or(0.0, |p| p.to_string().parse().unwrap_or(f64::from(p)));
    let cfg = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path(&problem.spec.name),
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": dropout,
        "target_modules": adapted_modules(&inv, lora),
        "bias": "none",
        "fan_in_fan_out": problem.spec.family == crate::model::Family::Gpt2,
        "inference_mode": false,
    });
    hold_to_rules("peft", rules::peft(&cfg))?;
    Ok(cfg)
}

/// Transformers' `BitsAndBytesConfig` of a QLoRA plan (NF4, double quantisation, compute and
/// storage in the plan's 16-bit dtype, the dtype the model is loaded in); a plain LoRA plan is
/// refused, it loads no quantised weights.
pub fn bitsandbytes_config(problem: &Problem, plan: &Plan) -> Result<Value> {
    let lora = lora_of(problem)?;
    if lora.base != BaseWeights::Nf4 {
        return Err(PlanError::Incompatible(
            "the plan keeps its LoRA base in 16 bits, so there is no bitsandbytes quantization to configure: plan with --lora-base nf4 for QLoRA"
                .into(),
        ));
    }
    let compute = match plan.strategy.precision {
        Precision::Fp16Mixed => "float16",
        Precision::Fp32 => "float32",
        Precision::Bf16Mixed | Precision::Bf16 => "bfloat16",
    };
    let cfg = json!({
        "quant_method": "bitsandbytes",
        "load_in_4bit": true,
        "load_in_8bit": false,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": true,
        "bnb_4bit_compute_dtype": compute,
        // The model's float dtype, which FSDP can shard and flatten with the unquantised
        // weights (bitsandbytes' fsdp_qlora guide; PEFT's `bnb_4bit_quant_storage=torch_dtype`).
        "bnb_4bit_quant_storage": compute,
        "llm_int8_skip_modules": ["lm_head"],
    });
    hold_to_rules("bitsandbytes", rules::bitsandbytes(&cfg, compute))?;
    Ok(cfg)
}
