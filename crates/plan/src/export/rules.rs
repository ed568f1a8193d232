//! The documented working combinations every export is held to: semantic rules over the
//! written configuration (not only its key names), each with the public source that states it.
//! Every exporter runs its check on the text it is about to return, so a configuration that
//! loads but breaks one of these rules (it fails only once FSDP or DeepSpeed wraps the model) is
//! never written.
//!
//! Not for: key names and value sets (the exporters write only documented keys), or whether the
//! plan fits (the cost model).

use serde_json::Value;
use std::fmt;

/// A documented rule a configuration breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// PEFT's FSDP guide runs LoRA and QLoRA with `fsdp_use_orig_params: false`
    /// (huggingface.co/docs/peft/accelerate/fsdp, "Use PEFT and FSDP" and "Use PEFT QLoRA and
    /// FSDP for finetuning large models on multiple GPUs": `fsdp_config_qlora.yaml`).
    FsdpLoraOrigParams,
    /// Under FSDP or ZeRO-3 the 4-bit weights are stored in the model's float dtype: "FSDP only
    /// supports sharding float data types" (huggingface.co/docs/bitsandbytes/fsdp_qlora), and
    /// PEFT's guide loads with `bnb_4bit_quant_storage` = `torch_dtype`
    /// (huggingface.co/docs/peft/accelerate/fsdp, "Use PEFT QLoRA and FSDP …").
    QuantStorageIsModelDtype { written: String, model: String },
    /// With `deepspeed_config_file`, Accelerate refuses its own copies of the JSON's settings:
    /// gradient_accumulation_steps, gradient_clipping, zero_stage, offload_*_device,
    /// offload_*_nvme_path, zero3_save_16bit_model, mixed_precision
    /// (huggingface.co/docs/accelerate/usage_guides/deepspeed, "deepspeed_config_file";
    /// `DeepSpeedPlugin._deepspeed_config_checks`).
    ConfigFileOwnsKey(String),
    /// The ds_config leaves clipping to `TrainingArguments.max_grad_norm` (`"gradient_clipping":
    /// "auto"`, huggingface.co/docs/transformers/deepspeed); a fixed value in Accelerate's
    /// plugin section overrides it.
    ClippingFixedInYaml,
    /// "bf16 and fp16 modes cannot be simultaneously enabled" (deepspeed/runtime/config.py;
    /// deepspeed.ai/docs/config-json, "BFLOAT16 training options").
    Bf16AndFp16,
    /// `offload_param` "is only valid with stage 3" (deepspeed.ai/docs/config-json,
    /// "Parameter offloading").
    ParamOffloadBelowStage3,
    /// DeepSpeed keeps bf16 master weights and optimizer states only under ZeRO stage 1–3
    /// (DeepSpeed PR #7700, github.com/deepspeedai/DeepSpeed/pull/7700).
    Bf16StatesAtStage0,
    /// torch.optim: "`fused` and `foreach` cannot be `True` together"
    /// (pytorch.org/docs/stable/generated/torch.optim.AdamW.html, `fused`).
    FusedAndForeach,
    /// `fused` and `foreach` are arguments of torch.optim's optimizers; bitsandbytes'
    /// `AdamW8bit` and `PagedAdamW8bit` take neither (huggingface.co/docs/bitsandbytes/reference/optim/adamw).
    KernelFlagOnNonTorchOptimizer(String),
    /// `base_model_name_or_path` is "the name of the base model to use"
    /// (huggingface.co/docs/peft/package_reference/config, `PeftConfig`): a Hub id or a model
    /// directory, which `from_pretrained` loads; a `config.json` file path loads nothing.
    BaseModelIsAFile(String),
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::FsdpLoraOrigParams => write!(
                f,
                "a LoRA/QLoRA model under FSDP needs fsdp_use_orig_params: false (PEFT's FSDP guide)"
            ),
            Rule::QuantStorageIsModelDtype { written, model } => write!(
                f,
                "bnb_4bit_quant_storage is {written} but the model's dtype is {model}; FSDP shards float dtypes only and flattens one dtype per unit (bitsandbytes' FSDP-QLoRA guide)"
            ),
            Rule::ConfigFileOwnsKey(k) => write!(
                f,
                "{k} is set beside deepspeed_config_file, which Accelerate refuses (the DeepSpeed JSON owns it)"
            ),
            Rule::ClippingFixedInYaml => write!(
                f,
                "gradient_clipping is fixed in the Accelerate YAML while the ds_config leaves it \"auto\" (TrainingArguments.max_grad_norm)"
            ),
            Rule::Bf16AndFp16 => {
                write!(f, "bf16 and fp16 are both enabled, which DeepSpeed refuses")
            }
            Rule::ParamOffloadBelowStage3 => {
                write!(
                    f,
                    "offload_param is set below ZeRO stage 3, where DeepSpeed ignores it"
                )
            }
            Rule::Bf16StatesAtStage0 => write!(
                f,
                "bf16 master weights and optimizer states are set at ZeRO stage 0; DeepSpeed keeps them only at stage 1–3"
            ),
            Rule::FusedAndForeach => write!(
                f,
                "the optimizer sets fused and foreach both True, which torch.optim refuses"
            ),
            Rule::KernelFlagOnNonTorchOptimizer(c) => write!(
                f,
                "{c} takes no fused/foreach argument (only torch.optim's optimizers do)"
            ),
            Rule::BaseModelIsAFile(p) => write!(
                f,
                "base_model_name_or_path {p} names a file; PEFT loads a Hub id or a model directory"
            ),
        }
    }
}

/// Values of the exporters' YAML (flat maps one level deep, `#` comments) as `section.key`.
fn yaml_value<'a>(yaml: &'a str, key: &str) -> Option<&'a str> {
    let mut section = "";
    for line in yaml.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (k, v) = line.split_once(':')?;
        let full = match k.strip_prefix("  ") {
            Some(inner) => {
                if format!("{section}.{inner}") == key {
                    return Some(v.trim().trim_matches('\''));
                }
                continue;
            }
            None => {
                section = k;
                k
            }
        };
        if full == key {
            return Some(v.trim().trim_matches('\''));
        }
    }
    None
}

/// Accelerate's config YAML; `lora` says whether the model carries PEFT adapters.
pub fn accelerate(yaml: &str, lora: bool) -> Result<(), Rule> {
    if yaml_value(yaml, "distributed_type") == Some("FSDP")
        && lora
        && yaml_value(yaml, "fsdp_config.fsdp_use_orig_params") != Some("false")
    {
        return Err(Rule::FsdpLoraOrigParams);
    }
    if yaml_value(yaml, "deepspeed_config.deepspeed_config_file").is_some() {
        for key in [
            "deepspeed_config.gradient_accumulation_steps",
            "deepspeed_config.gradient_clipping",
            "deepspeed_config.zero_stage",
            "deepspeed_config.offload_optimizer_device",
            "deepspeed_config.offload_param_device",
            "deepspeed_config.offload_optimizer_nvme_path",
            "deepspeed_config.offload_param_nvme_path",
            "deepspeed_config.zero3_save_16bit_model",
            "mixed_precision",
        ] {
            if yaml_value(yaml, key).is_some() {
                return Err(Rule::ConfigFileOwnsKey(key.into()));
            }
        }
    } else if yaml_value(yaml, "deepspeed_config.gradient_clipping").is_some() {
        return Err(Rule::ClippingFixedInYaml);
    }
    Ok(())
}

/// Transformers' `BitsAndBytesConfig`; `model_dtype` is the float dtype the model is loaded in
/// (`torch_dtype`, as `to_dict()` names dtypes: `bfloat16`, `float16`, `float32`).
pub fn bitsandbytes(cfg: &Value, model_dtype: &str) -> Result<(), Rule> {
    let written = cfg["bnb_4bit_quant_storage"].as_str().unwrap_or("uint8");
    if cfg["load_in_4bit"] == true && written != model_dtype {
        return Err(Rule::QuantStorageIsModelDtype {
            written: written.into(),
            model: model_dtype.into(),
        });
    }
    Ok(())
}

/// DeepSpeed's ds_config.
pub fn deepspeed(cfg: &Value) -> Result<(), Rule> {
    if cfg["bf16"]["enabled"] == true && cfg["fp16"]["enabled"] == true {
        return Err(Rule::Bf16AndFp16);
    }
    let stage = cfg["zero_optimization"]["stage"].as_u64().unwrap_or(0);
    if !cfg["zero_optimization"]["offload_param"].is_null() && stage < 3 {
        return Err(Rule::ParamOffloadBelowStage3);
    }
    let bf16_states = cfg["bf16"]["bf16_master_weights_and_grads"] == true
        || cfg["bf16"]["bf16_optimizer_states"] == true;
    if bf16_states && stage == 0 {
        return Err(Rule::Bf16StatesAtStage0);
    }
    Ok(())
}

/// torchtune's recipe overrides.
pub fn torchtune(yaml: &str) -> Result<(), Rule> {
    let fused = yaml_value(yaml, "optimizer.fused");
    let foreach = yaml_value(yaml, "optimizer.foreach");
    if fused == Some("True") && foreach == Some("True") {
        return Err(Rule::FusedAndForeach);
    }
    let component = yaml_value(yaml, "optimizer._component_").unwrap_or("");
    if (fused.is_some() || foreach.is_some()) && !component.starts_with("torch.optim.") {
        return Err(Rule::KernelFlagOnNonTorchOptimizer(component.into()));
    }
    Ok(())
}

/// PEFT's `adapter_config.json`.
pub fn peft(cfg: &Value) -> Result<(), Rule> {
    let base = cfg["base_model_name_or_path"].as_str().unwrap_or("");
    if base.ends_with(".json") || std::path::Path::new(base).is_file() {
        return Err(Rule::BaseModelIsAFile(base.into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_values_are_read_by_section() {
        let y = "# c\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_use_orig_params: false\nmixed_precision: 'no'\n";
        assert_eq!(yaml_value(y, "distributed_type"), Some("FSDP"));
        assert_eq!(
            yaml_value(y, "fsdp_config.fsdp_use_orig_params"),
            Some("false")
        );
        assert_eq!(yaml_value(y, "mixed_precision"), Some("no"));
        assert_eq!(yaml_value(y, "fsdp_use_orig_params"), None);
    }
}
