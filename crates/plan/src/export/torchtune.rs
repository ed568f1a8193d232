//! The keys of a torchtune single-device recipe config (`tune run lora_finetune_single_device
//! --config FILE`, or `full_finetune_single_device`) that express a plan: `dtype`, the batch
//! split, `enable_activation_checkpointing`, `optimizer_in_bwd`, the optimizer component
//! (`torch.optim.AdamW`, `bitsandbytes.optim.AdamW8bit`, `bitsandbytes.optim.PagedAdamW8bit`),
//! the chunked loss (`CEWithChunkedOutputLoss`, 8 chunks) and for LoRA the model builder's
//! `lora_attn_modules`, `apply_lora_to_mlp`, `apply_lora_to_output`, `lora_rank`, `lora_alpha`
//! (QLoRA: the `qlora_*` builder), and torch.optim's `fused`/`foreach` flags of the kernel the
//! plan assumes (`--optimizer-impl`). Names are those of torchtune's recipe configs and its
//! "Memory optimization overview" (pytorch.org/torchtune/main/tutorials/memory_optimizations).
//!
//! Refused, with the reason: several GPUs (the distributed recipes shard with FSDP2: use the
//! Accelerate or DeepSpeed export), mixed precision (torchtune trains in pure bf16 or fp32: no
//! fp32 master weights), every-k-th or budget checkpointing (the flag is every layer or none),
//! offload of optimizer states or parameters, optimizers torchtune's configs do not name, a
//! chunked loss of other than 8 chunks, and MLP adapters on part of a gated MLP (torchtune
//! adapts its three projections together).
//!
//! Not for: the recipe's data, tokenizer and checkpointer sections, which the plan does not
//! decide; the file is the overrides to put into the recipe's own config.

use super::{hold_to_rules, rules};
use crate::cost::{Plan, Problem};
use crate::error::{PlanError, Result};
use crate::model::Family;
use crate::strategy::{
    BaseWeights, Checkpoint, Lora, LoraTarget, Loss, Offload, Optimizer, OptimizerImpl, Precision,
};

fn refuse(reason: String) -> PlanError {
    PlanError::Export {
        format: "torchtune".into(),
        reason,
    }
}

/// torchtune's builder of the model (`torchtune.models.…`), for the presets it ships.
fn builder(problem: &Problem, lora: Option<&Lora>) -> Option<String> {
    let (module, name) = match problem.spec.name.as_str() {
        "llama-2-7b" => ("llama2", "llama2_7b"),
        "llama-2-13b" => ("llama2", "llama2_13b"),
        "llama-2-70b" => ("llama2", "llama2_70b"),
        "llama-3-8b" => ("llama3", "llama3_8b"),
        "llama-3-70b" => ("llama3", "llama3_70b"),
        "llama-3.1-8b" => ("llama3_1", "llama3_1_8b"),
        "llama-3.2-1b" => ("llama3_2", "llama3_2_1b"),
        "llama-3.2-3b" => ("llama3_2", "llama3_2_3b"),
        _ => return None,
    };
    let prefix = match lora.map(|l| l.base) {
        None => "",
        Some(BaseWeights::Plain) => "lora_",
        Some(BaseWeights::Nf4) => "qlora_",
    };
    Some(format!("torchtune.models.{module}.{prefix}{name}"))
}

/// The LoRA keys of the model section: attention modules, MLP and output flags, rank, alpha,
/// the planned dropout.
fn lora_keys(lora: &Lora, dropout: f32) -> Result<String> {
    use LoraTarget::*;
    let t = &lora.targets;
    let mut attn = Vec::new();
    for (target, module) in [(Q, "q_proj"), (K, "k_proj"), (V, "v_proj")] {
        if t.adapts_attention_input(target) {
            attn.push(module);
        }
    }
    if t.contains(O) {
        attn.push("output_proj");
    }
    let mlp: Vec<LoraTarget> = [Gate, Up, Down]
        .into_iter()
        .filter(|&x| t.contains(x))
        .collect();
    if !mlp.is_empty() && mlp.len() < 3 {
        let named: Vec<&str> = mlp.iter().map(|x| x.name()).collect();
        return Err(refuse(format!(
            "torchtune adapts the MLP's three projections together (apply_lora_to_mlp: True) and the plan adapts only {}: add the others to --lora-targets (gate,up,down) or drop them",
            named.join(", ")
        )));
    }
    if attn.is_empty() && mlp.is_empty() {
        return Err(refuse(
            "the plan adapts no projection torchtune names".into(),
        ));
    }
    let list = attn.join(", ");
    Ok(format!(
        "  lora_attn_modules: [{list}]\n  apply_lora_to_mlp: {}\n  apply_lora_to_output: False\n  lora_rank: {}\n  lora_alpha: {}\n  lora_dropout: {:?}\n",
        if mlp.is_empty() { "False" } else { "True" },
        lora.rank,
        lora.alpha,
        dropout
    ))
}

/// The YAML of `plan`'s recipe overrides.
pub fn torchtune_config(problem: &Problem, plan: &Plan) -> Result<String> {
    let s = &plan.strategy;
    let world = problem.hardware.world_size();
    if world > 1 {
        return Err(refuse(format!(
            "this export writes a single-device recipe's keys and the plan runs on {world} GPUs (torchtune's distributed recipes shard with FSDP2); use --emit accelerate or --emit deepspeed"
        )));
    }
    let dtype = match s.precision {
        Precision::Bf16 => "bf16",
        Precision::Fp32 => "fp32",
        other => {
            return Err(refuse(format!(
                "torchtune trains in pure bf16 or fp32 (dtype: bf16 keeps no fp32 master weights) and the plan is {other}; plan with --precision bf16 (or fp32)"
            )));
        }
    };
    let checkpointing = match s.checkpoint {
        Checkpoint::None => "False",
        Checkpoint::ALL_BLOCKS => "True",
        other => {
            return Err(refuse(format!(
                "enable_activation_checkpointing checkpoints every layer and the plan uses {other}; plan with --checkpoint all or none"
            )));
        }
    };
    if s.placement.offload_optimizer != Offload::None || s.placement.offload_params != Offload::None
    {
        return Err(refuse(
            "the single-device recipes do not offload optimizer states or parameters; pin --offload-optimizer none --offload-params none, or use --emit deepspeed".into(),
        ));
    }
    let optimizer = match s.optimizer {
        Optimizer::AdamW => "torch.optim.AdamW",
        // Under dtype bf16 torch's AdamW keeps its states in bf16: the same bytes.
        Optimizer::AdamWBf16 if s.precision == Precision::Bf16 => "torch.optim.AdamW",
        Optimizer::AdamW8bit => "bitsandbytes.optim.AdamW8bit",
        Optimizer::PagedAdamW8bit => "bitsandbytes.optim.PagedAdamW8bit",
        Optimizer::Sgd | Optimizer::SgdMomentum => "torch.optim.SGD",
        other => {
            return Err(refuse(format!(
                "torchtune's configs name no {other} component; pin --optimizer adamw, adamw-8bit or paged-adamw-8bit"
            )));
        }
    };
    let lora = problem.workload.lora.as_ref();
    let mut y = String::from(
        "# torchtune recipe overrides written by `headroom plan --emit torchtune`: merge them into\n# the recipe's config (its data, tokenizer and checkpointer sections are yours).\n",
    );
    let model_keys = match lora {
        Some(l) => Some(lora_keys(l, problem.workload.lora_dropout.unwrap_or(0.0))?),
        None => None,
    };
    let llama_like = matches!(
        problem.spec.family,
        Family::Llama | Family::Mistral | Family::Qwen2 | Family::Gemma | Family::Gemma2
    );
    if lora.is_some() && !llama_like {
        return Err(refuse(format!(
            "torchtune's LoRA builders name Llama-style projections (q_proj … output_proj, w1–w3), and {} is a {} model",
            problem.spec.name,
            problem.spec.family.model_type()
        )));
    }
    match (builder(problem, lora), &model_keys) {
        (Some(b), keys) => {
            y += &format!("model:\n  _component_: {b}\n");
            y += keys.as_deref().unwrap_or("");
        }
        (None, Some(keys)) => {
            y += "# model._component_: the torchtune builder of your model (lora_… or qlora_…)\n";
            y += "model:\n";
            y += keys;
        }
        (None, None) => {}
    }
    y += &format!("dtype: {dtype}\n");
    y += &format!("batch_size: {}\n", s.micro_batch);
    y += &format!("gradient_accumulation_steps: {}\n", s.accumulation);
    y += &format!("enable_activation_checkpointing: {checkpointing}\n");
    // torchtune offloads every saved activation; under checkpointing those are the blocks'
    // inputs, the plan's offload.
    y += &format!(
        "enable_activation_offloading: {}\n",
        if s.placement.offload_activations.is_offloaded() {
            "True"
        } else {
            "False"
        }
    );
    y += &format!(
        "optimizer_in_bwd: {}\n",
        if s.optimizer_in_backward {
            "True"
        } else {
            "False"
        }
    );
    // The recipes' `compile` (torch.compile of the model and the loss), as the plan's step
    // time assumed it (`Problem::compile`).
    y += &format!(
        "compile: {}\n",
        if problem.compile { "True" } else { "False" }
    );
    y += &format!("optimizer:\n  _component_: {optimizer}\n");
    // The kernel the plan charged the step's temporaries for, as torch.optim's `fused` and
    // `foreach` arguments (both written, so a recipe's own `fused: True` cannot add to a
    // foreach plan); bitsandbytes' optimizers take neither.
    if optimizer.starts_with("torch.optim.") {
        let (fused, foreach) = match problem.optimizer_impl {
            OptimizerImpl::Fused => ("True", "False"),
            OptimizerImpl::Foreach => ("False", "True"),
            OptimizerImpl::PerTensor => ("False", "False"),
        };
        y += &format!("  fused: {fused}\n  foreach: {foreach}\n");
    }
    match s.loss {
        Loss::Plain => y += "loss:\n  _component_: torch.nn.CrossEntropyLoss\n",
        Loss::Chunked(8) => {
            y += "loss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n"
        }
        Loss::Chunked(k) => {
            return Err(refuse(format!(
                "CEWithChunkedOutputLoss cuts the output into 8 chunks and the plan uses {k}; plan with --loss chunked:8"
            )));
        }
    }
    hold_to_rules("torchtune", rules::torchtune(&y))?;
    Ok(y)
}
