//! An Accelerate config YAML (`accelerate launch --config_file`) for a plan: FSDP settings when
//! FSDP can express the plan (ZeRO-3 → FULL_SHARD, ZeRO-1/2 → SHARD_GRAD_OP, ZeRO-0 on several
//! GPUs → NO_SHARD; CPU offload of parameters and optimizer together → `fsdp_offload_params`),
//! otherwise Accelerate's DeepSpeed plugin section (optimizer-only offload, NVMe, with the
//! `offload_*_nvme_path` keys; when the ds_config is exported too, only
//! `deepspeed_config_file` pointing at it, which keeps its buckets, gathering limits, `"auto"`
//! clipping and NVMe paths). FSDP with LoRA adapters sets `fsdp_use_orig_params: false`, as
//! PEFT's FSDP and FSDP-QLoRA guides do. Keys are those of huggingface.co/docs/accelerate (the
//! `accelerate config` file, usage_guides/fsdp, usage_guides/deepspeed). Refused: pure bf16 (no
//! Accelerate key keeps master weights and states in bf16) and checkpointing policies other than
//! none/all under FSDP (`fsdp_activation_checkpointing` is every block); several nodes need
//! rank 0's address (`--main-process-ip`). Written by a small emitter: every value is a scalar
//! or a flat map.

use super::{ExportOptions, fidelity, hold_to_rules, rules};
use crate::cost::{Plan, Problem};
use crate::error::{PlanError, Result};
use crate::strategy::{Checkpoint, Framework, Loss, Offload, Precision};

/// Builds the YAML text of `plan`.
pub fn accelerate_config(problem: &Problem, plan: &Plan, opts: &ExportOptions) -> Result<String> {
    let s = &plan.strategy;
    if s.optimizer_in_backward {
        return Err(fidelity::refuse_step_in_backward(
            problem,
            plan,
            "accelerate",
        ));
    }
    let hw = &problem.hardware;
    let world = hw.world_size();
    let mixed = match s.precision {
        Precision::Bf16Mixed => "bf16",
        Precision::Fp16Mixed => "fp16",
        Precision::Fp32 => "'no'",
        Precision::Bf16 => {
            return Err(fidelity::refuse_pure_bf16(
                problem,
                plan,
                "accelerate",
                "Accelerate has no setting for that (mixed_precision bf16 keeps fp32 master \
                 weights; the deepspeed_config keys have no bf16 state options); use --emit \
                 deepspeed at ZeRO ≥ 1 and point Accelerate's deepspeed_config_file at it",
            ));
        }
    };
    if s.placement.offload_activations.is_offloaded() {
        return Err(fidelity::refuse_activation_offload(
            problem,
            plan,
            "accelerate",
        ));
    }
    // The plan's own framework decides the plugin: its memory is that framework's layout.
    let fsdp_can = problem.framework == Framework::Fsdp
        && (s.placement.offload_optimizer == Offload::None
            || (s.placement.offload_optimizer == Offload::Cpu
                && s.placement.offload_params == Offload::Cpu));
    let mut y = String::from("# Accelerate config written by `headroom plan --emit accelerate`\n");
    y += "compute_environment: LOCAL_MACHINE\ndebug: false\n";
    if s.placement.zero_stage.number() == 0 && s.placement.offload_optimizer == Offload::None {
        y += &format!(
            "distributed_type: {}\n",
            if world > 1 { "MULTI_GPU" } else { "'NO'" }
        );
    } else if fsdp_can {
        if !matches!(s.checkpoint, Checkpoint::None | Checkpoint::ALL_BLOCKS) {
            return Err(fidelity::refuse_partial_checkpointing(
                problem,
                plan,
                "accelerate",
            ));
        }
        let strategy = match s.placement.zero_stage.number() {
            3 => "FULL_SHARD",
            _ => "SHARD_GRAD_OP",
        };
        y += "distributed_type: FSDP\nfsdp_config:\n";
        let items = [
            (
                "fsdp_activation_checkpointing",
                (s.checkpoint == Checkpoint::ALL_BLOCKS).to_string(),
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
            // PEFT's FSDP guides (huggingface.co/docs/peft/accelerate/fsdp) keep the flat
            // parameters for LoRA and QLoRA; other plans keep the original parameters.
            (
                "fsdp_use_orig_params",
                problem.workload.lora.is_none().to_string(),
            ),
        ];
        for (k, v) in items {
            y += &format!("  {k}: {v}\n");
        }
    } else if let Some(file) = &opts.deepspeed_config_file {
        // Accelerate reads every DeepSpeed setting from the file and refuses its own copies of
        // them beside it (usage_guides/deepspeed, "deepspeed_config_file").
        y += "distributed_type: DEEPSPEED\ndeepspeed_config:\n";
        y += &format!("  deepspeed_config_file: {file}\n");
        y += &format!(
            "  zero3_init_flag: {}\n",
            s.placement.zero_stage.shards_parameters()
        );
    } else {
        y += "distributed_type: DEEPSPEED\ndeepspeed_config:\n";
        y += "# bucket sizes and stage-3 gathering are DeepSpeed's defaults here, not the plan's: export the ds_config too (--emit deepspeed FILE) to have this file point at it\n";
        // No gradient_clipping: Accelerate then leaves it "auto" (TrainingArguments'
        // max_grad_norm), as the ds_config does.
        y += &format!("  gradient_accumulation_steps: {}\n", s.accumulation);
        y += &format!(
            "  offload_optimizer_device: {}\n",
            s.placement.offload_optimizer
        );
        if s.placement.offload_optimizer == Offload::Nvme {
            y += &format!("  offload_optimizer_nvme_path: {}\n", opts.nvme_path);
        }
        y += &format!("  offload_param_device: {}\n", s.placement.offload_params);
        if s.placement.offload_params == Offload::Nvme {
            y += &format!("  offload_param_nvme_path: {}\n", opts.nvme_path);
        }
        y += &format!(
            "  zero3_init_flag: {}\n",
            s.placement.zero_stage.shards_parameters()
        );
        y += &format!("  zero_stage: {}\n", s.placement.zero_stage);
    }
    if y.contains("distributed_type: FSDP") || s.checkpoint == Checkpoint::None {
    } else {
        y += &format!(
            "# --checkpoint {} is a model setting here: call gradient_checkpointing_enable() (every block) or apply the policy in the model code\n",
            s.checkpoint
        );
    }
    if let Loss::Chunked(k) = s.loss {
        y += &format!(
            "# --loss chunked:{k} is a model setting here: Liger Kernel's fused linear cross-entropy (use_liger_kernel=True in Transformers' TrainingArguments) holds as little; torchtune's CEWithChunkedOutputLoss(num_output_chunks={k}) upcasts one chunk at a time but keeps the 16-bit logits\n"
        );
    }
    y += "downcast_bf16: 'no'\n";
    if hw.nodes > 1 {
        let Some(ip) = &opts.main_process_ip else {
            return Err(PlanError::Export {
                format: "accelerate".into(),
                reason: format!(
                    "a run on {} nodes needs the address of the machine of rank 0 \
                     (main_process_ip); pass --main-process-ip HOST (and --main-process-port, \
                     default {})",
                    hw.nodes, opts.main_process_port
                ),
            });
        };
        y += "# machine_rank: this file is for the machine of rank 0; set 1, 2, … on the others\n";
        y += "machine_rank: 0\n";
        y += &format!("main_process_ip: {ip}\n");
        y += &format!("main_process_port: {}\n", opts.main_process_port);
    } else {
        y += "machine_rank: 0\n";
    }
    y += "main_training_function: main\n";
    if opts.deepspeed_config_file.is_none() || !y.contains("distributed_type: DEEPSPEED") {
        y += &format!("mixed_precision: {mixed}\n");
    }
    y += &format!("num_machines: {}\nnum_processes: {world}\n", hw.nodes);
    y += "rdzv_backend: static\nsame_network: true\ntpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: false\n";
    hold_to_rules(
        "accelerate",
        rules::accelerate(&y, problem.workload.lora.is_some()),
    )?;
    Ok(y)
}
