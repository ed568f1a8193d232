//! The documented schemas of the mesh frameworks the torchtitan and Megatron-LM exports are
//! checked against: key names and value sets with their source.

use std::collections::BTreeMap;
use toml::Table;

/// torchtitan v0.2.2 job config fields of the sections the export writes, and the values of the
/// enumerated ones (`torchtitan/config/job_config.py` at tag v0.2.2: the dataclasses `Model`,
/// `Optimizer`, `Training`, `Parallelism`, `ActivationCheckpoint`, `Compile`; the pipeline
/// schedules are the names `torch.distributed.pipelining.schedules` registers).
pub fn torchtitan_schema() -> BTreeMap<&'static str, &'static [&'static str]> {
    BTreeMap::from([
        (
            "model",
            &[
                "name",
                "flavor",
                "hf_assets_path",
                "tokenizer_path",
                "converters",
                "print_after_conversion",
            ][..],
        ),
        (
            "optimizer",
            &[
                "name",
                "lr",
                "beta1",
                "beta2",
                "eps",
                "weight_decay",
                "implementation",
                "early_step_in_backward",
            ][..],
        ),
        (
            "training",
            &[
                "dataset",
                "dataset_path",
                "local_batch_size",
                "global_batch_size",
                "seq_len",
                "max_norm",
                "steps",
                "enable_cpu_offload",
                "dtype",
                "mixed_precision_param",
                "mixed_precision_reduce",
                "gc_freq",
                "gc_debug",
                "dataloader",
            ][..],
        ),
        (
            "parallelism",
            &[
                "data_parallel_replicate_degree",
                "data_parallel_shard_degree",
                "fsdp_reshard_after_forward",
                "tensor_parallel_degree",
                "disable_loss_parallel",
                "enable_async_tensor_parallel",
                "pipeline_parallel_degree",
                "module_fqns_per_model_part",
                "pipeline_parallel_first_stage_less_layers",
                "pipeline_parallel_last_stage_less_layers",
                "pipeline_parallel_layers_per_stage",
                "pipeline_parallel_schedule",
                "pipeline_parallel_schedule_csv",
                "pipeline_parallel_microbatch_size",
                "context_parallel_degree",
                "context_parallel_load_balancer",
                "context_parallel_rotate_method",
                "expert_parallel_degree",
                "expert_tensor_parallel_degree",
            ][..],
        ),
        (
            "activation_checkpoint",
            &[
                "mode",
                "selective_ac_option",
                "per_op_sac_force_recompute_mm_shapes_by_fqns",
                "early_stop",
                "memory_budget",
                "preserve_rng_state",
                "debug",
            ][..],
        ),
        ("compile", &["enable", "components", "backend"][..]),
    ])
}

/// The enumerated values (`Literal[...]` in the same dataclasses).
pub fn torchtitan_values(key: &str) -> Option<&'static [&'static str]> {
    Some(match key {
        "model.name" => &["llama3"][..],
        "model.flavor" => &["debugmodel", "8B", "70B", "405B"][..],
        "optimizer.name" => &["AdamW", "Adam"][..],
        "optimizer.implementation" => &["for-loop", "foreach", "fused"][..],
        "training.dtype" | "training.mixed_precision_param" => &["bfloat16", "float32"][..],
        "training.mixed_precision_reduce" => &["float32"][..],
        "parallelism.fsdp_reshard_after_forward" => &["default", "always", "never"][..],
        "parallelism.pipeline_parallel_schedule" => &[
            "1F1B",
            "Interleaved1F1B",
            "GPipe",
            "LoopedBFS",
            "InterleavedZeroBubble",
            "ZBVZeroBubble",
            "DualPipeV",
        ][..],
        "activation_checkpoint.mode" => &["selective", "full", "memory_budget", "none"][..],
        _ => return None,
    })
}

/// Checks every section, key and enumerated value of a torchtitan job TOML; returns the
/// `section.key` → value map (strings unquoted).
pub fn check_torchtitan(text: &str) -> BTreeMap<String, String> {
    let job: Table = text.parse().expect("the export parses as TOML");
    let schema = torchtitan_schema();
    let mut out = BTreeMap::new();
    for (section, keys) in &job {
        let known = schema
            .get(section.as_str())
            .unwrap_or_else(|| panic!("[{section}] is not a torchtitan job config section"));
        for (key, value) in keys.as_table().expect("a section is a table") {
            assert!(
                known.contains(&key.as_str()),
                "{section}.{key} is not a torchtitan key"
            );
            let full = format!("{section}.{key}");
            let v = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_string);
            if let Some(allowed) = torchtitan_values(&full) {
                assert!(
                    allowed.contains(&v.as_str()),
                    "{full} = {v} is not one of {allowed:?}"
                );
            }
            out.insert(full, v);
        }
    }
    out
}

/// Megatron-LM flags the export may write, with the values of the enumerated ones
/// (`megatron/training/arguments.py` `choices=`, and `examples/llama/train_llama3_8b_h100_fp8.sh`,
/// `examples/gpt3/train_gpt3_175b_distributed.sh`, `examples/megatron_fsdp/` for the rest).
pub fn megatron_flags() -> BTreeMap<&'static str, Option<&'static [&'static str]>> {
    let free: Option<&'static [&'static str]> = None;
    BTreeMap::from([
        ("--use-mcore-models", free),
        ("--num-layers", free),
        ("--hidden-size", free),
        ("--ffn-hidden-size", free),
        ("--num-attention-heads", free),
        ("--group-query-attention", free),
        ("--num-query-groups", free),
        ("--kv-channels", free),
        ("--seq-length", free),
        ("--max-position-embeddings", free),
        ("--attention-dropout", free),
        ("--hidden-dropout", free),
        (
            "--position-embedding-type",
            Some(
                &[
                    "learned_absolute",
                    "rope",
                    "yarn",
                    "mrope",
                    "relative",
                    "none",
                ][..],
            ),
        ),
        ("--normalization", Some(&["LayerNorm", "RMSNorm"][..])),
        ("--swiglu", free),
        ("--disable-bias-linear", free),
        ("--add-qkv-bias", free),
        ("--untie-embeddings-and-output-weights", free),
        (
            "--attention-backend",
            Some(&["flash", "fused", "unfused", "local", "auto"][..]),
        ),
        ("--tensor-model-parallel-size", free),
        ("--sequence-parallel", free),
        ("--pipeline-model-parallel-size", free),
        ("--context-parallel-size", free),
        ("--expert-model-parallel-size", free),
        ("--num-experts", free),
        ("--moe-router-topk", free),
        (
            "--moe-token-dispatcher-type",
            Some(&["allgather", "alltoall", "flex"][..]),
        ),
        ("--num-layers-per-virtual-pipeline-stage", free),
        ("--decoder-first-pipeline-num-layers", free),
        ("--decoder-last-pipeline-num-layers", free),
        ("--use-distributed-optimizer", free),
        ("--tp-comm-overlap", free),
        ("--use-megatron-fsdp", free),
        (
            "--data-parallel-sharding-strategy",
            Some(&["no_shard", "optim", "optim_grads", "optim_grads_params"][..]),
        ),
        ("--micro-batch-size", free),
        ("--global-batch-size", free),
        ("--recompute-granularity", Some(&["full", "selective"][..])),
        ("--recompute-method", Some(&["uniform", "block"][..])),
        ("--recompute-num-layers", free),
        ("--bf16", free),
        (
            "--optimizer",
            Some(
                &[
                    "adam",
                    "sgd",
                    "muon",
                    "dist_muon",
                    "lion",
                    "soap",
                    "adaptive_muon",
                ][..],
            ),
        ),
    ])
}

/// Checks every flag and enumerated value of a Megatron-LM arguments file; returns flag → value
/// ("" for switches).
pub fn check_megatron(text: &str) -> BTreeMap<String, String> {
    let flags = megatron_flags();
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (flag, value) = line.split_once(' ').unwrap_or((line, ""));
        let allowed = flags
            .get(flag)
            .unwrap_or_else(|| panic!("{flag} is not a Megatron-LM argument the export may write"));
        if let Some(values) = allowed {
            assert!(
                values.contains(&value),
                "{flag} {value} is not one of {values:?}"
            );
        }
        assert!(
            out.insert(flag.to_string(), value.to_string()).is_none(),
            "{flag} written twice"
        );
    }
    out
}
