//! The documented schemas the exports are checked against: every key name (and, where the docs
//! list them, every value) with its source. Shared by the export tests.

use serde_json::Value;
use std::collections::BTreeMap;

/// DeepSpeed ds_config keys, by section. Source: https://www.deepspeed.ai/docs/config-json/
/// ("Batch Size related parameters", "Optimizer Parameters", "FP16 training options", "BFLOAT16
/// training options", "ZeRO Optimizations for FP16 Training", offload_param/offload_optimizer),
/// plus `bf16_master_weights_and_grads` and `bf16_optimizer_states` from DeepSpeed's
/// blogs/core_api_update ("Low-precision master params, grads, and optimizer states", PR #7700,
/// github.com/deepspeedai/DeepSpeed/pull/7700), and the "Activation Checkpointing" section
/// (partition_activations, cpu_checkpointing, contiguous_memory_optimization,
/// number_checkpoints, synchronize_checkpoint_boundary, profile).
pub fn deepspeed_keys(section: &str) -> &'static [&'static str] {
    match section {
        "" => &[
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
            "gradient_clipping",
            "optimizer",
            "scheduler",
            "fp16",
            "bf16",
            "zero_optimization",
            "activation_checkpointing",
        ],
        "activation_checkpointing" => &[
            "partition_activations",
            "cpu_checkpointing",
            "contiguous_memory_optimization",
            "number_checkpoints",
            "synchronize_checkpoint_boundary",
            "profile",
        ],
        "optimizer" => &["type", "params"],
        // AdamW (torch.optim.AdamW arguments) and Lamb ("lr", "weight_decay", "bias_correction",
        // "max_coeff", "min_coeff" in the Lamb example of the config docs).
        "optimizer.params" => &[
            "lr",
            "betas",
            "eps",
            "weight_decay",
            "bias_correction",
            "max_coeff",
            "min_coeff",
        ],
        "fp16" => &[
            "enabled",
            "auto_cast",
            "loss_scale",
            "initial_scale_power",
            "loss_scale_window",
            "hysteresis",
            "consecutive_hysteresis",
            "min_loss_scale",
        ],
        "bf16" => &[
            "enabled",
            "immediate_grad_update",
            "check_grad_overflow",
            "bf16_master_weights_and_grads",
            "bf16_optimizer_states",
        ],
        "zero_optimization" => &[
            "stage",
            "allgather_partitions",
            "allgather_bucket_size",
            "overlap_comm",
            "reduce_scatter",
            "reduce_bucket_size",
            "contiguous_gradients",
            "offload_param",
            "offload_optimizer",
            "stage3_max_live_parameters",
            "stage3_max_reuse_distance",
            "stage3_prefetch_bucket_size",
            "stage3_param_persistence_threshold",
            "stage3_gather_16bit_weights_on_model_save",
            "sub_group_size",
        ],
        "zero_optimization.offload_param" => &[
            "device",
            "nvme_path",
            "pin_memory",
            "buffer_count",
            "buffer_size",
            "max_in_cpu",
        ],
        "zero_optimization.offload_optimizer" => &[
            "device",
            "nvme_path",
            "pin_memory",
            "ratio",
            "buffer_count",
            "fast_init",
        ],
        _ => &[],
    }
}

/// Keys the Hugging Face Trainer's DeepSpeed integration may find as `"auto"` and fills from
/// TrainingArguments. Source: https://huggingface.co/docs/transformers/deepspeed ("DeepSpeed and
/// Trainer parameters": batch sizes, gradient clipping, optimizer lr/betas/eps/weight_decay,
/// scheduler parameters, fp16/bf16 enabled, the ZeRO bucket sizes and stage-3 thresholds).
pub const HF_AUTO: &[&str] = &[
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "fp16.enabled",
    "bf16.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
];

/// Checks every key of a ds_config against [`deepspeed_keys`], `"auto"` only where
/// [`HF_AUTO`] allows it, and the documented values of `optimizer.type` (config docs: "Adam,
/// AdamW, OneBitAdam, Lamb, and OneBitLamb") and offload `device` ("none", "cpu", "nvme").
pub fn check_deepspeed(cfg: &Value) {
    fn walk(v: &Value, path: &str) {
        let Value::Object(map) = v else { return };
        let allowed = deepspeed_keys(path);
        for (k, child) in map {
            let full = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            assert!(
                allowed.contains(&k.as_str()),
                "ds_config key {full} is not documented"
            );
            if child == "auto" {
                assert!(
                    HF_AUTO.contains(&full.as_str()),
                    "{full} cannot be \"auto\""
                );
            }
            if k == "type" {
                let t = child.as_str().unwrap();
                assert!(
                    ["Adam", "AdamW", "OneBitAdam", "Lamb", "OneBitLamb"].contains(&t),
                    "{t}"
                );
            }
            if k == "device" {
                let d = child.as_str().unwrap();
                assert!(["none", "cpu", "nvme"].contains(&d), "{d}");
            }
            if child.is_object() {
                walk(child, &full);
            }
        }
    }
    walk(cfg, "");
}

/// Accelerate config keys and values. Sources: https://huggingface.co/docs/accelerate/package_reference/cli
/// (`accelerate config`/`launch`: compute_environment, distributed_type, mixed_precision "no,
/// fp16, bf16, fp8", num_machines, num_processes, machine_rank, main_process_ip,
/// main_process_port, rdzv_backend "static, c10d", same_network, main_training_function,
/// downcast_bf16, tpu_*, use_cpu, debug); https://huggingface.co/docs/accelerate/usage_guides/fsdp
/// (fsdp_config keys, sharding strategies, backward prefetch, state dict types);
/// https://huggingface.co/docs/accelerate/usage_guides/deepspeed (deepspeed_config keys:
/// offload_*_device "none, cpu, nvme", offload_*_nvme_path, zero3_init_flag, zero_stage 0–3).
pub fn accelerate_schema() -> BTreeMap<&'static str, &'static [&'static str]> {
    BTreeMap::from([
        (
            "compute_environment",
            &["LOCAL_MACHINE", "AMAZON_SAGEMAKER"][..],
        ),
        ("debug", &["true", "false"][..]),
        (
            "distributed_type",
            &["NO", "MULTI_GPU", "FSDP", "DEEPSPEED"][..],
        ),
        ("downcast_bf16", &["no", "yes"][..]),
        ("machine_rank", &[][..]),
        ("main_process_ip", &[][..]),
        ("main_process_port", &[][..]),
        ("main_training_function", &[][..]),
        ("mixed_precision", &["no", "fp16", "bf16", "fp8"][..]),
        ("num_machines", &[][..]),
        ("num_processes", &[][..]),
        ("rdzv_backend", &["static", "c10d"][..]),
        ("same_network", &["true", "false"][..]),
        ("tpu_env", &[][..]),
        ("tpu_use_cluster", &["false", "true"][..]),
        ("tpu_use_sudo", &["false", "true"][..]),
        ("use_cpu", &["false", "true"][..]),
        ("fsdp_config", &[][..]),
        ("deepspeed_config", &[][..]),
        (
            "fsdp_config.fsdp_activation_checkpointing",
            &["true", "false"][..],
        ),
        (
            "fsdp_config.fsdp_auto_wrap_policy",
            &["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"][..],
        ),
        (
            "fsdp_config.fsdp_backward_prefetch",
            &["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"][..],
        ),
        (
            "fsdp_config.fsdp_cpu_ram_efficient_loading",
            &["true", "false"][..],
        ),
        ("fsdp_config.fsdp_forward_prefetch", &["true", "false"][..]),
        ("fsdp_config.fsdp_offload_params", &["true", "false"][..]),
        (
            "fsdp_config.fsdp_sharding_strategy",
            &[
                "FULL_SHARD",
                "SHARD_GRAD_OP",
                "NO_SHARD",
                "HYBRID_SHARD",
                "HYBRID_SHARD_ZERO2",
            ][..],
        ),
        (
            "fsdp_config.fsdp_state_dict_type",
            &["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"][..],
        ),
        (
            "fsdp_config.fsdp_sync_module_states",
            &["true", "false"][..],
        ),
        ("fsdp_config.fsdp_transformer_layer_cls_to_wrap", &[][..]),
        ("fsdp_config.fsdp_use_orig_params", &["true", "false"][..]),
        // "deepspeed_config_file: path to the DeepSpeed config file"
        // (huggingface.co/docs/accelerate/usage_guides/deepspeed, "deepspeed_config_file").
        ("deepspeed_config.deepspeed_config_file", &[][..]),
        ("deepspeed_config.gradient_accumulation_steps", &[][..]),
        ("deepspeed_config.gradient_clipping", &[][..]),
        (
            "deepspeed_config.offload_optimizer_device",
            &["none", "cpu", "nvme"][..],
        ),
        (
            "deepspeed_config.offload_param_device",
            &["none", "cpu", "nvme"][..],
        ),
        ("deepspeed_config.offload_optimizer_nvme_path", &[][..]),
        ("deepspeed_config.offload_param_nvme_path", &[][..]),
        ("deepspeed_config.zero3_init_flag", &["true", "false"][..]),
        (
            "deepspeed_config.zero3_save_16bit_model",
            &["true", "false"][..],
        ),
        ("deepspeed_config.zero_stage", &["0", "1", "2", "3"][..]),
    ])
}

/// The exporters' YAML (flat maps one level deep, `#` comment lines) as `section.key` and
/// value pairs, in order (a section's own line has an empty value; quotes are dropped).
fn yaml_keys(yaml: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in yaml.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (k, v) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("not key: value: {line}"));
        let key = match k.strip_prefix("  ") {
            Some(inner) => format!("{section}.{inner}"),
            None => {
                section = k.to_string();
                k.to_string()
            }
        };
        out.push((key, v.trim().trim_matches('\'').to_string()));
    }
    out
}

/// Parses the exporter's YAML into `section.key → value`, checking each against
/// [`accelerate_schema`].
pub fn check_accelerate(yaml: &str) -> BTreeMap<String, String> {
    let schema = accelerate_schema();
    let mut out = BTreeMap::new();
    for (key, v) in yaml_keys(yaml) {
        let allowed = schema
            .get(key.as_str())
            .unwrap_or_else(|| panic!("Accelerate key {key} is not documented"));
        assert!(
            allowed.is_empty() || allowed.contains(&v.as_str()),
            "{key}: {v} not among {allowed:?}"
        );
        out.insert(key, v);
    }
    out
}

/// PEFT `LoraConfig` fields an `adapter_config.json` may hold, with the documented values of
/// the enumerated ones. Source: https://huggingface.co/docs/peft/package_reference/lora
/// (`LoraConfig`: r, lora_alpha, target_modules, lora_dropout, fan_in_fan_out, bias ∈ {"none",
/// "all", "lora_only"}) and https://huggingface.co/docs/peft/package_reference/config
/// (`PeftConfig`: peft_type, task_type ∈ TaskType, base_model_name_or_path, inference_mode).
pub fn check_peft(config: &Value) {
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("peft_type", &["LORA"][..]),
        (
            "task_type",
            &[
                "SEQ_CLS",
                "SEQ_2_SEQ_LM",
                "CAUSAL_LM",
                "TOKEN_CLS",
                "QUESTION_ANS",
                "FEATURE_EXTRACTION",
            ][..],
        ),
        ("base_model_name_or_path", &[][..]),
        ("r", &[][..]),
        ("lora_alpha", &[][..]),
        ("lora_dropout", &[][..]),
        ("target_modules", &[][..]),
        ("bias", &["none", "all", "lora_only"][..]),
        ("fan_in_fan_out", &[][..]),
        ("inference_mode", &[][..]),
    ]);
    check_flat(config, &allowed, "PEFT LoraConfig");
}

/// Transformers `BitsAndBytesConfig.to_dict()` keys, with documented values. Source:
/// https://huggingface.co/docs/transformers/main_classes/quantization (`BitsAndBytesConfig`:
/// load_in_4bit, load_in_8bit, llm_int8_skip_modules, bnb_4bit_compute_dtype,
/// bnb_4bit_quant_type ∈ {"fp4", "nf4"}, bnb_4bit_use_double_quant, bnb_4bit_quant_storage;
/// quant_method "bitsandbytes").
pub fn check_bitsandbytes(config: &Value) {
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("quant_method", &["bitsandbytes"][..]),
        ("load_in_4bit", &[][..]),
        ("load_in_8bit", &[][..]),
        ("bnb_4bit_quant_type", &["fp4", "nf4"][..]),
        ("bnb_4bit_use_double_quant", &[][..]),
        (
            "bnb_4bit_compute_dtype",
            &["float32", "float16", "bfloat16"][..],
        ),
        (
            "bnb_4bit_quant_storage",
            &["uint8", "float16", "bfloat16", "float32"][..],
        ),
        ("llm_int8_skip_modules", &[][..]),
    ]);
    check_flat(config, &allowed, "BitsAndBytesConfig");
}

fn check_flat(config: &Value, allowed: &BTreeMap<&str, &[&str]>, tool: &str) {
    let object = config.as_object().expect("a JSON object");
    for (key, value) in object {
        let values = allowed
            .get(key.as_str())
            .unwrap_or_else(|| panic!("{tool} key {key} is not documented"));
        if let Some(text) = value.as_str() {
            assert!(
                values.is_empty() || values.contains(&text),
                "{tool} {key}: {text} not among {values:?}"
            );
        }
    }
}

/// torchtune single-device recipe config keys (a `key:` line per top-level key, `  key:` per
/// nested one) with the values the configs use. Source: torchtune's recipe configs
/// (github.com/pytorch/torchtune, recipes/configs/llama2/7B_lora_single_device.yaml,
/// 7B_qlora_single_device.yaml, llama3_1/8B_full_single_device.yaml: dtype, batch_size,
/// gradient_accumulation_steps, enable_activation_checkpointing, enable_activation_offloading,
/// optimizer_in_bwd, compile, optimizer._component_, loss._component_, model._component_ and the LoRA
/// builders' lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha,
/// lora_dropout) and its "Memory optimization overview" tutorial (PagedAdamW8bit,
/// CEWithChunkedOutputLoss).
pub fn check_torchtune(yaml: &str) -> BTreeMap<String, String> {
    let bools: &[&str] = &["True", "False"];
    let schema: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("model", &[][..]),
        ("model._component_", &[][..]),
        ("model.lora_attn_modules", &[][..]),
        ("model.apply_lora_to_mlp", bools),
        ("model.apply_lora_to_output", bools),
        ("model.lora_rank", &[][..]),
        ("model.lora_alpha", &[][..]),
        ("model.lora_dropout", &[][..]),
        ("dtype", &["bf16", "fp32"][..]),
        ("batch_size", &[][..]),
        ("gradient_accumulation_steps", &[][..]),
        ("enable_activation_checkpointing", bools),
        ("enable_activation_offloading", bools),
        ("optimizer_in_bwd", bools),
        // The recipes' "compile: False  # torch.compile the model + loss, True increases speed
        // + decreases memory" (llama3_1/8B_full_single_device.yaml).
        ("compile", bools),
        ("optimizer", &[][..]),
        (
            "optimizer._component_",
            &[
                "torch.optim.AdamW",
                "torch.optim.SGD",
                "bitsandbytes.optim.AdamW8bit",
                "bitsandbytes.optim.PagedAdamW8bit",
            ][..],
        ),
        // torch.optim.AdamW(..., foreach=None, ..., fused=None)
        // (pytorch.org/docs/stable/generated/torch.optim.AdamW.html); torchtune's configs write
        // `fused: True` under `optimizer`.
        ("optimizer.fused", bools),
        ("optimizer.foreach", bools),
        ("loss", &[][..]),
        (
            "loss._component_",
            &[
                "torch.nn.CrossEntropyLoss",
                "torchtune.modules.loss.CEWithChunkedOutputLoss",
            ][..],
        ),
    ]);
    let mut out = BTreeMap::new();
    for (key, v) in yaml_keys(yaml) {
        let allowed = schema
            .get(key.as_str())
            .unwrap_or_else(|| panic!("torchtune key {key} is not documented"));
        assert!(
            allowed.is_empty() || v.is_empty() || allowed.contains(&v.as_str()),
            "{key}: {v} not among {allowed:?}"
        );
        out.insert(key, v);
    }
    out
}
