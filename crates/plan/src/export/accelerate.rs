//! An Accelerate config YAML (`accelerate launch --config_file`) for a plan: FSDP settings when
//! FSDP can express the plan (ZeRO-3 → FULL_SHARD, ZeRO-1/2 → SHARD_GRAD_OP, ZeRO-0 on several
//! GPUs → NO_SHARD; CPU offload of parameters and optimizer together → `fsdp_offload_params`),
//! otherwise Accelerate's DeepSpeed plugin section (optimizer-only offload, NVMe). Written by a
//! small emitter: every value is a scalar or a flat map.

use crate::cost::{Plan, Problem};
use crate::error::Result;
use crate::strategy::{Checkpoint, Offload, Precision};

/// Builds the YAML text of `plan`.
pub fn accelerate_config(problem: &Problem, plan: &Plan) -> Result<String> {
    let s = &plan.strategy;
    let hw = &problem.hardware;
    let world = hw.world_size();
    let mixed = match s.precision {
        Precision::Bf16Mixed | Precision::Bf16 => "bf16",
        Precision::Fp16Mixed => "fp16",
        Precision::Fp32 => "'no'",
    };
    let fsdp_can = s.placement.offload_optimizer == Offload::None
        || (s.placement.offload_optimizer == Offload::Cpu
            && s.placement.offload_params == Offload::Cpu);
    let mut y = String::from("# Accelerate config written by `headroom plan --emit accelerate`\n");
    y += "compute_environment: LOCAL_MACHINE\ndebug: false\n";
    if s.placement.zero_stage.number() == 0 && s.placement.offload_optimizer == Offload::None {
        y += &format!(
            "distributed_type: {}\n",
            if world > 1 { "MULTI_GPU" } else { "'NO'" }
        );
    } else if fsdp_can {
        let strategy = match s.placement.zero_stage.number() {
            3 => "FULL_SHARD",
            _ => "SHARD_GRAD_OP",
        };
        y += "distributed_type: FSDP\nfsdp_config:\n";
        let items = [
            (
                "fsdp_activation_checkpointing",
                (s.checkpoint != Checkpoint::None).to_string(),
            ),
            ("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP".into()),
            ("fsdp_backward_prefetch", "BACKWARD_PRE".into()),
            ("fsdp_cpu_ram_efficient_loading", "true".into()),
            ("fsdp_forward_prefetch", "false".into()),
            (
                "fsdp_offload_params",
                (s.placement.offload_params == Offload::Cpu).to_string(),
            ),
            ("fsdp_sharding_strategy", strategy.into()),
            ("fsdp_state_dict_type", "SHARDED_STATE_DICT".into()),
            ("fsdp_sync_module_states", "true".into()),
            (
                "fsdp_transformer_layer_cls_to_wrap",
                problem.spec.family.block_class().into(),
            ),
            ("fsdp_use_orig_params", "true".into()),
        ];
        for (k, v) in items {
            y += &format!("  {k}: {v}\n");
        }
    } else {
        y += "distributed_type: DEEPSPEED\ndeepspeed_config:\n";
        y += &format!("  gradient_accumulation_steps: {}\n", s.accumulation);
        y += "  gradient_clipping: 1.0\n";
        y += &format!(
            "  offload_optimizer_device: {}\n",
            s.placement.offload_optimizer
        );
        y += &format!("  offload_param_device: {}\n", s.placement.offload_params);
        y += &format!(
            "  zero3_init_flag: {}\n",
            s.placement.zero_stage.shards_parameters()
        );
        y += &format!("  zero_stage: {}\n", s.placement.zero_stage);
    }
    y += "downcast_bf16: 'no'\nmachine_rank: 0\nmain_training_function: main\n";
    y += &format!("mixed_precision: {mixed}\n");
    y += &format!("num_machines: {}\nnum_processes: {world}\n", hw.nodes);
    y += "rdzv_backend: static\nsame_network: true\ntpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: false\n";
    Ok(y)
}
