//! The exports against the documented working combinations: the FSDP + QLoRA configuration
//! PEFT documents, the Accelerate YAML pointing at the ds_config, torchtune's optimizer kernel
//! flag, PEFT's base model name, and one test per rule of `export::rules` that a broken
//! configuration is caught.

use crate::support;

use headroom_plan::cost::{Problem, evaluate};
use headroom_plan::export::rules::{self, Rule};
use headroom_plan::export::{ExportOptions, accelerate::accelerate_config, peft, torchtune};
use headroom_plan::strategy::{
    Attention, BaseWeights, Checkpoint, Framework, Lora, Loss, Offload, Optimizer, OptimizerImpl,
    Placement, Precision, Strategy,
};
use serde_json::json;
use support::schemas::{check_accelerate, check_bitsandbytes, check_peft, check_torchtune};
use support::{plan, problem};

fn with_lora(p: Problem, base: BaseWeights) -> Problem {
    let lora = Lora::new(8, 16.0, "all-linear".parse().unwrap(), base).unwrap();
    let w = p.workload.clone().with_lora(&p.spec, lora).unwrap();
    Problem::new(p.spec, p.hardware, w, p.cost)
}

/// Llama-2-70B QLoRA on two GPUs under FSDP (ZeRO-3 = FULL_SHARD), bf16 mixed precision.
fn fsdp_qlora() -> (Problem, headroom_plan::cost::Plan) {
    let p = with_lora(
        problem("llama-2-70b", "A100-80GB", 2, 1, 2048, 8),
        BaseWeights::Nf4,
    )
    .with_framework(Framework::Fsdp);
    let best = plan(
        &p,
        Precision::Bf16Mixed,
        3,
        Offload::None,
        Offload::None,
        Checkpoint::ALL_BLOCKS,
    );
    (p, best)
}

#[test]
fn fsdp_qlora_exports_are_the_configuration_peft_documents() {
    let (p, best) = fsdp_qlora();
    let yaml = accelerate_config(&p, &best, &ExportOptions::default()).unwrap();
    let keys = check_accelerate(&yaml);
    assert_eq!(keys["distributed_type"], "FSDP");
    // PEFT's fsdp_config_qlora.yaml: "fsdp_use_orig_params: false"
    // (https://huggingface.co/docs/peft/accelerate/fsdp, "Use PEFT QLoRA and FSDP for finetuning
    // large models on multiple GPUs").
    assert_eq!(keys["fsdp_config.fsdp_use_orig_params"], "false");
    // The same guide: `--bnb_4bit_quant_storage_dtype "bfloat16"`, the dtype the bf16 model is
    // loaded in ("FSDP only supports sharding float data types",
    // https://huggingface.co/docs/bitsandbytes/fsdp_qlora).
    let bnb = peft::bitsandbytes_config(&p, &best).unwrap();
    check_bitsandbytes(&bnb);
    assert_eq!(bnb["bnb_4bit_quant_storage"], "bfloat16");
    assert_eq!(bnb["bnb_4bit_compute_dtype"], "bfloat16");
    // A full fine-tune keeps the original parameters (Accelerate's default for FSDP,
    // https://huggingface.co/docs/accelerate/usage_guides/fsdp: "fsdp_use_orig_params: true").
    let full = problem("llama-2-70b", "A100-80GB", 2, 1, 2048, 8).with_framework(Framework::Fsdp);
    let best = plan(
        &full,
        Precision::Bf16Mixed,
        3,
        Offload::None,
        Offload::None,
        Checkpoint::ALL_BLOCKS,
    );
    let keys =
        check_accelerate(&accelerate_config(&full, &best, &ExportOptions::default()).unwrap());
    assert_eq!(keys["fsdp_config.fsdp_use_orig_params"], "true");
}

/// The keys Accelerate refuses beside `deepspeed_config_file`: "When using
/// `deepspeed_config_file`, the following accelerate config variables will be ignored:
/// ['gradient_accumulation_steps', 'gradient_clipping', 'zero_stage', 'offload_optimizer_device',
/// 'offload_param_device', 'zero3_save_16bit_model', 'mixed_precision']"
/// (https://huggingface.co/docs/accelerate/usage_guides/deepspeed).
const OWNED_BY_THE_JSON: [&str; 9] = [
    "deepspeed_config.gradient_accumulation_steps",
    "deepspeed_config.gradient_clipping",
    "deepspeed_config.zero_stage",
    "deepspeed_config.offload_optimizer_device",
    "deepspeed_config.offload_param_device",
    "deepspeed_config.offload_optimizer_nvme_path",
    "deepspeed_config.offload_param_nvme_path",
    "deepspeed_config.zero3_save_16bit_model",
    "mixed_precision",
];

#[test]
fn the_deepspeed_plugin_yaml_points_at_the_ds_config_and_repeats_none_of_it() {
    let p = problem("llama-2-7b", "A100-40GB", 4, 1, 2048, 32);
    let best = plan(
        &p,
        Precision::Bf16Mixed,
        3,
        Offload::Nvme,
        Offload::Nvme,
        Checkpoint::ALL_BLOCKS,
    );
    let opts = ExportOptions {
        deepspeed_config_file: Some("configs/ds.json".into()),
        ..ExportOptions::default()
    };
    let keys = check_accelerate(&accelerate_config(&p, &best, &opts).unwrap());
    assert_eq!(keys["distributed_type"], "DEEPSPEED");
    assert_eq!(
        keys["deepspeed_config.deepspeed_config_file"],
        "configs/ds.json"
    );
    // The documented example keeps zero3_init_flag beside the file.
    assert_eq!(keys["deepspeed_config.zero3_init_flag"], "true");
    for key in OWNED_BY_THE_JSON {
        assert!(!keys.contains_key(key), "{key} is set beside the file");
    }
    // Without the file the plugin's keys remain, but clipping is left to Accelerate's "auto"
    // (TrainingArguments.max_grad_norm), as the ds_config's "gradient_clipping": "auto"
    // (https://huggingface.co/docs/transformers/deepspeed).
    let keys = check_accelerate(&accelerate_config(&p, &best, &ExportOptions::default()).unwrap());
    assert_eq!(keys["deepspeed_config.zero_stage"], "3");
    assert!(!keys.contains_key("deepspeed_config.gradient_clipping"));
}

#[test]
fn torchtune_writes_the_optimizer_kernel_the_plan_assumes() {
    let p = problem("llama-3.2-1b", "A100-80GB", 1, 1, 2048, 8);
    let s = Strategy {
        precision: Precision::Bf16,
        optimizer: Optimizer::AdamW,
        placement: Placement::default(),
        checkpoint: Checkpoint::ALL_BLOCKS,
        attention: Attention::MemoryEfficient,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch: 2,
        accumulation: 4,
    };
    // torchtune's full_finetune_single_device configs: "optimizer: _component_:
    // torch.optim.AdamW … fused: True"
    // (https://pytorch.org/torchtune/main/tutorials/memory_optimizations.html).
    let fused = p.clone().with_optimizer_impl(OptimizerImpl::Fused);
    let keys =
        check_torchtune(&torchtune::torchtune_config(&fused, &evaluate(&fused, &s)).unwrap());
    assert_eq!(keys["optimizer._component_"], "torch.optim.AdamW");
    assert_eq!(keys["optimizer.fused"], "True");
    assert_eq!(keys["optimizer.foreach"], "False");
    // A foreach plan says so, and turns a recipe's own `fused: True` off.
    let foreach = p.with_optimizer_impl(OptimizerImpl::Foreach);
    let keys =
        check_torchtune(&torchtune::torchtune_config(&foreach, &evaluate(&foreach, &s)).unwrap());
    assert_eq!(
        (
            keys["optimizer.fused"].as_str(),
            keys["optimizer.foreach"].as_str()
        ),
        ("False", "True")
    );
}

#[test]
fn peft_names_the_base_model_by_its_hub_id_or_its_directory() {
    // adapter_config.json's "base_model_name_or_path" is "the name of the base model to use"
    // (https://huggingface.co/docs/peft/package_reference/config), e.g.
    // "meta-llama/Llama-2-7b-hf": the Hub id the built-in model's config.json comes from.
    let p = with_lora(
        problem("llama-2-7b", "A100-80GB", 1, 1, 512, 8),
        BaseWeights::Plain,
    );
    let cfg = peft::adapter_config(&p).unwrap();
    check_peft(&cfg);
    assert_eq!(cfg["base_model_name_or_path"], "meta-llama/Llama-2-7b-hf");
    // A config.json given by path: the directory holding it, which from_pretrained loads.
    let dir = std::env::temp_dir().join(format!("headroom-peft-base-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("config.json");
    let text = headroom_plan::model::presets::preset_config("llama-2-7b").unwrap();
    std::fs::write(&file, text).unwrap();
    let p = with_lora(
        problem(file.to_str().unwrap(), "A100-80GB", 1, 1, 512, 8),
        BaseWeights::Plain,
    );
    let cfg = peft::adapter_config(&p).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(cfg["base_model_name_or_path"], dir.to_str().unwrap());
}

// One test per rule: a configuration that breaks it is caught, and the one the exporter
// writes passes.

#[test]
fn rule_fsdp_lora_keeps_flat_parameters() {
    let (p, best) = fsdp_qlora();
    let yaml = accelerate_config(&p, &best, &ExportOptions::default()).unwrap();
    assert_eq!(rules::accelerate(&yaml, true), Ok(()));
    let broken = yaml.replace("fsdp_use_orig_params: false", "fsdp_use_orig_params: true");
    assert_eq!(
        rules::accelerate(&broken, true),
        Err(Rule::FsdpLoraOrigParams)
    );
}

#[test]
fn rule_quant_storage_is_the_models_dtype() {
    let (p, best) = fsdp_qlora();
    let mut bnb = peft::bitsandbytes_config(&p, &best).unwrap();
    assert_eq!(rules::bitsandbytes(&bnb, "bfloat16"), Ok(()));
    bnb["bnb_4bit_quant_storage"] = json!("uint8");
    assert_eq!(
        rules::bitsandbytes(&bnb, "bfloat16"),
        Err(Rule::QuantStorageIsModelDtype {
            written: "uint8".into(),
            model: "bfloat16".into()
        })
    );
}

#[test]
fn rule_the_ds_config_file_owns_its_settings() {
    let yaml = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n  zero3_init_flag: true\nnum_processes: 4\n";
    assert_eq!(rules::accelerate(yaml, false), Ok(()));
    let broken = yaml.replace(
        "  zero3_init_flag: true\n",
        "  zero3_init_flag: true\n  gradient_clipping: 1.0\n",
    );
    assert_eq!(
        rules::accelerate(&broken, false),
        Err(Rule::ConfigFileOwnsKey(
            "deepspeed_config.gradient_clipping".into()
        ))
    );
    let broken = format!("{yaml}mixed_precision: bf16\n");
    assert_eq!(
        rules::accelerate(&broken, false),
        Err(Rule::ConfigFileOwnsKey("mixed_precision".into()))
    );
}

#[test]
fn rule_clipping_is_not_fixed_in_the_plugin_yaml() {
    let yaml = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n";
    assert_eq!(rules::accelerate(yaml, false), Ok(()));
    let broken = format!("{yaml}  gradient_clipping: 1.0\n");
    assert_eq!(
        rules::accelerate(&broken, false),
        Err(Rule::ClippingFixedInYaml)
    );
}

#[test]
fn rule_deepspeed_refuses_bf16_with_fp16() {
    let cfg = json!({"bf16": {"enabled": true}, "fp16": {"enabled": true}});
    assert_eq!(rules::deepspeed(&cfg), Err(Rule::Bf16AndFp16));
    assert_eq!(
        rules::deepspeed(&json!({"bf16": {"enabled": true}})),
        Ok(())
    );
}

#[test]
fn rule_parameter_offload_needs_stage_3() {
    let cfg = |stage: u8| json!({"zero_optimization": {"stage": stage, "offload_param": {"device": "cpu"}}});
    assert_eq!(rules::deepspeed(&cfg(3)), Ok(()));
    assert_eq!(
        rules::deepspeed(&cfg(2)),
        Err(Rule::ParamOffloadBelowStage3)
    );
}

#[test]
fn rule_bf16_states_need_zero() {
    let cfg = |stage: u8| {
        json!({"bf16": {"enabled": true, "bf16_optimizer_states": true},
               "zero_optimization": {"stage": stage}})
    };
    assert_eq!(rules::deepspeed(&cfg(1)), Ok(()));
    assert_eq!(rules::deepspeed(&cfg(0)), Err(Rule::Bf16StatesAtStage0));
}

#[test]
fn rule_fused_and_foreach_are_not_both_on() {
    let yaml = "optimizer:\n  _component_: torch.optim.AdamW\n  fused: True\n  foreach: False\n";
    assert_eq!(rules::torchtune(yaml), Ok(()));
    let broken = yaml.replace("foreach: False", "foreach: True");
    assert_eq!(rules::torchtune(&broken), Err(Rule::FusedAndForeach));
}

#[test]
fn rule_kernel_flags_only_on_torch_optimizers() {
    let yaml = "optimizer:\n  _component_: bitsandbytes.optim.PagedAdamW8bit\n";
    assert_eq!(rules::torchtune(yaml), Ok(()));
    let broken = format!("{yaml}  fused: True\n");
    assert_eq!(
        rules::torchtune(&broken),
        Err(Rule::KernelFlagOnNonTorchOptimizer(
            "bitsandbytes.optim.PagedAdamW8bit".into()
        ))
    );
}

#[test]
fn rule_the_base_model_is_not_a_file() {
    let good = json!({"base_model_name_or_path": "meta-llama/Llama-2-7b-hf"});
    assert_eq!(rules::peft(&good), Ok(()));
    let broken = json!({"base_model_name_or_path": "models/llama/config.json"});
    assert_eq!(
        rules::peft(&broken),
        Err(Rule::BaseModelIsAFile("models/llama/config.json".into()))
    );
}
