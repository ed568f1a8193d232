//! The exports implement the plan or refuse with the reason: pure bf16 in DeepSpeed's bf16
//! state options (refused at ZeRO-0 and by Accelerate, with the bytes fp32 states cost),
//! every-k-th checkpointing refused by Accelerate's FSDP, the Trainer's "auto" values, the
//! multi-node rendezvous and the NVMe paths; every emitted key is checked against the tool's
//! documented schema (tests/support/schemas.rs, with the source of each list).

use crate::support;

use headroom_memory::format_bytes;
use headroom_plan::cost::{Problem, evaluate};
use headroom_plan::export::{ExportOptions, accelerate::accelerate_config, deepspeed::ds_config};
use headroom_plan::strategy::{
    Attention, Checkpoint, Framework, Loss, Offload, Optimizer, Placement, Precision, Strategy,
};
use support::schemas::{check_accelerate, check_deepspeed};
use support::{plan, problem};

/// Llama-2-7B: 6,738,415,616 parameters (the count of LlamaForCausalLM for
/// meta-llama/Llama-2-7b-hf, also asserted in tests/param_counts.rs).
const LLAMA2_7B: u64 = 6_738_415_616;

#[test]
fn pure_bf16_uses_deepspeeds_bf16_state_options_at_zero_1() {
    let p = problem("llama-2-7b", "H100-80GB", 8, 1, 2048, 8);
    let pl = plan(
        &p,
        Precision::Bf16,
        1,
        Offload::None,
        Offload::None,
        Checkpoint::ALL_BLOCKS,
    );
    let cfg = ds_config(&p, &pl, &ExportOptions::default()).unwrap();
    check_deepspeed(&cfg);
    // DeepSpeed blogs/core_api_update: both options true keep master weights, gradients and
    // optimizer states in bf16.
    assert_eq!(cfg["bf16"]["enabled"], true);
    assert_eq!(cfg["bf16"]["bf16_master_weights_and_grads"], true);
    assert_eq!(cfg["bf16"]["bf16_optimizer_states"], true);
    assert_eq!(cfg["optimizer"]["type"], "AdamW");
    // Mixed precision keeps DeepSpeed's default (fp32 masters): no state options.
    let mixed = plan(
        &p,
        Precision::Bf16Mixed,
        1,
        Offload::None,
        Offload::None,
        Checkpoint::ALL_BLOCKS,
    );
    let cfg = ds_config(&p, &mixed, &ExportOptions::default()).unwrap();
    assert!(cfg["bf16"].get("bf16_optimizer_states").is_none(), "{cfg}");
}

#[test]
fn pure_bf16_without_zero_is_refused_with_the_cost_of_fp32_states() {
    // One GPU, ZeRO-0: the plan holds AdamW's two states in bf16 (2 × 2 B) and no master copy;
    // DeepSpeed and Accelerate would hold fp32 masters (4 B) and fp32 states (2 × 4 B):
    // 4 + 8 − 4 = 8 B per parameter more.
    let p = problem("llama-2-7b", "H200-141GB", 1, 1, 512, 1);
    let pl = plan(
        &p,
        Precision::Bf16,
        0,
        Offload::None,
        Offload::None,
        Checkpoint::ALL_BLOCKS,
    );
    let extra = format_bytes(8 * LLAMA2_7B);
    let ds = ds_config(&p, &pl, &ExportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(ds.contains(&format!("{extra} more per GPU")), "{ds}");
    assert!(ds.contains("--zero 1"), "{ds}");
    let acc = accelerate_config(&p, &pl, &ExportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(acc.contains(&format!("{extra} more per GPU")), "{acc}");
    assert!(acc.contains("fp32 master weights"), "{acc}");
}

#[test]
fn accelerate_refuses_every_kth_checkpointing_under_fsdp() {
    let p = problem("llama-2-7b", "A100-80GB", 8, 1, 2048, 8).with_framework(Framework::Fsdp);
    let every4 = plan(
        &p,
        Precision::Bf16Mixed,
        3,
        Offload::None,
        Offload::None,
        Checkpoint::EveryNth(4),
    );
    let e = accelerate_config(&p, &every4, &ExportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--checkpoint every:4") && e.contains("fsdp_activation_checkpointing"),
        "{e}"
    );
    assert!(e.contains("--checkpoint all"), "{e}");
    let all = plan(
        &p,
        Precision::Bf16Mixed,
        3,
        Offload::None,
        Offload::None,
        Checkpoint::ALL_BLOCKS,
    );
    let kv = check_accelerate(&accelerate_config(&p, &all, &ExportOptions::default()).unwrap());
    assert_eq!(kv["fsdp_config.fsdp_activation_checkpointing"], "true");
    assert_eq!(kv["fsdp_config.fsdp_sharding_strategy"], "FULL_SHARD");
}

#[test]
fn deepspeed_leaves_the_trainers_hyper_parameters_auto_and_the_batch_explicit() {
    let p = problem("llama-2-7b", "A100-80GB", 8, 1, 2048, 64);
    let pl = plan(
        &p,
        Precision::Bf16Mixed,
        3,
        Offload::None,
        Offload::None,
        Checkpoint::ALL_BLOCKS,
    );
    let cfg = ds_config(&p, &pl, &ExportOptions::default()).unwrap();
    check_deepspeed(&cfg);
    for k in ["lr", "betas", "eps", "weight_decay"] {
        assert_eq!(cfg["optimizer"]["params"][k], "auto", "{k}");
    }
    assert_eq!(cfg["gradient_clipping"], "auto");
    // The plan's split: 1 × 8 accumulation × 8 GPUs = 64.
    assert_eq!(cfg["train_batch_size"], 64);
    assert_eq!(cfg["train_micro_batch_size_per_gpu"], 1);
    assert_eq!(cfg["gradient_accumulation_steps"], 8);
    assert_eq!(cfg["bf16"]["enabled"], true);
}

#[test]
fn multi_node_accelerate_names_the_rank_0_machine() {
    let p = problem("llama-2-7b", "A100-80GB", 8, 2, 2048, 16);
    let pl = plan(
        &p,
        Precision::Bf16Mixed,
        3,
        Offload::None,
        Offload::None,
        Checkpoint::None,
    );
    let e = accelerate_config(&p, &pl, &ExportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("--main-process-ip"), "{e}");
    let opts = ExportOptions {
        main_process_ip: Some("10.1.2.3".into()),
        ..ExportOptions::default()
    };
    let kv = check_accelerate(&accelerate_config(&p, &pl, &opts).unwrap());
    assert_eq!(kv["main_process_ip"], "10.1.2.3");
    assert_eq!(kv["main_process_port"], "29500");
    assert_eq!(kv["num_machines"], "2");
    assert_eq!(kv["machine_rank"], "0");
    assert_eq!(kv["num_processes"], "16");
}

#[test]
fn nvme_offload_writes_the_nvme_paths() {
    let p = problem("llama-2-7b", "A100-80GB", 8, 1, 2048, 8);
    let pl = plan(
        &p,
        Precision::Bf16Mixed,
        3,
        Offload::Nvme,
        Offload::Nvme,
        Checkpoint::ALL_BLOCKS,
    );
    let opts = ExportOptions {
        nvme_path: "/mnt/nvme0".into(),
        ..ExportOptions::default()
    };
    let kv = check_accelerate(&accelerate_config(&p, &pl, &opts).unwrap());
    assert_eq!(kv["distributed_type"], "DEEPSPEED");
    assert_eq!(kv["deepspeed_config.offload_optimizer_device"], "nvme");
    assert_eq!(
        kv["deepspeed_config.offload_optimizer_nvme_path"],
        "/mnt/nvme0"
    );
    assert_eq!(kv["deepspeed_config.offload_param_nvme_path"], "/mnt/nvme0");
    let cfg = ds_config(&p, &pl, &opts).unwrap();
    check_deepspeed(&cfg);
    let z = &cfg["zero_optimization"];
    assert_eq!(z["offload_optimizer"]["nvme_path"], "/mnt/nvme0");
    assert_eq!(z["offload_param"]["nvme_path"], "/mnt/nvme0");
}

#[test]
fn single_gpu_and_cpu_offload_exports_match_the_schemas() {
    let p = problem("gpt2", "RTX-4090", 1, 1, 1024, 8);
    for pl in [
        plan(
            &p,
            Precision::Bf16Mixed,
            0,
            Offload::None,
            Offload::None,
            Checkpoint::None,
        ),
        plan(
            &p,
            Precision::Fp32,
            2,
            Offload::Cpu,
            Offload::None,
            Checkpoint::None,
        ),
        plan(
            &p,
            Precision::Bf16Mixed,
            3,
            Offload::Cpu,
            Offload::Cpu,
            Checkpoint::ALL_BLOCKS,
        ),
    ] {
        check_accelerate(&accelerate_config(&p, &pl, &ExportOptions::default()).unwrap());
        check_deepspeed(&ds_config(&p, &pl, &ExportOptions::default()).unwrap());
    }
}

#[test]
fn a_chunked_loss_is_named_as_a_model_setting_and_changes_no_key() {
    let p = problem("llama-3-8b", "H100-80GB", 8, 1, 8192, 8);
    let plain = plan(
        &p,
        Precision::Bf16Mixed,
        3,
        Offload::None,
        Offload::None,
        Checkpoint::ALL_BLOCKS,
    );
    let chunked = evaluate(
        &p,
        &Strategy {
            loss: Loss::Chunked(8),
            ..plain.strategy
        },
    );
    let opts = ExportOptions::default();
    let (a, b) = (
        accelerate_config(&p, &plain, &opts).unwrap(),
        accelerate_config(&p, &chunked, &opts).unwrap(),
    );
    let comment = "# --loss chunked:8 is a model setting here: Liger Kernel's fused linear \
                   cross-entropy (use_liger_kernel=True";
    assert!(b.contains(comment) && !a.contains("--loss"), "{b}");
    // Without its comment lines the YAML is the plain plan's, and it still matches the schema.
    let keys = |y: &str| -> Vec<String> {
        y.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(keys(&a), keys(&b));
    check_accelerate(&b);
    assert_eq!(
        ds_config(&p, &plain, &opts).unwrap(),
        ds_config(&p, &chunked, &opts).unwrap()
    );
}

#[test]
fn the_step_in_backward_is_refused_with_what_the_tools_would_hold_instead() {
    let p = problem("llama-2-7b", "RTX-4090", 1, 1, 1024, 1);
    let ordinary = plan(
        &p,
        Precision::Bf16,
        0,
        Offload::None,
        Offload::None,
        Checkpoint::ALL_BLOCKS,
    );
    let fused = evaluate(
        &p,
        &Strategy {
            optimizer_in_backward: true,
            ..ordinary.strategy
        },
    );
    let extra = ordinary.memory.per_device_peak_bytes - fused.memory.per_device_peak_bytes;
    let opts = ExportOptions::default();
    for e in [
        ds_config(&p, &fused, &opts).unwrap_err().to_string(),
        accelerate_config(&p, &fused, &opts)
            .unwrap_err()
            .to_string(),
    ] {
        assert!(
            e.contains("optimizer_in_bwd")
                && e.contains(&headroom_memory::format_bytes(extra))
                && e.contains("--optimizer-in-backward false"),
            "{e}"
        );
    }
}

#[test]
fn lora_plans_export_peft_and_bitsandbytes_configs_named_as_the_models_modules() {
    use headroom_plan::export::peft::{adapter_config, bitsandbytes_config};
    use headroom_plan::strategy::{BaseWeights, Lora};
    use support::schemas::{check_bitsandbytes, check_peft};
    let lora_problem = |model: &str, targets: &str, base: BaseWeights| {
        let p = problem(model, "A100-80GB", 1, 1, 512, 8);
        let lora = Lora::new(16, 32.0, targets.parse().unwrap(), base).unwrap();
        let w = p.workload.clone().with_lora(&p.spec, lora).unwrap();
        Problem::new(p.spec, p.hardware, w, p.cost)
    };
    // Llama: PEFT's module names, each projection its own.
    let p = lora_problem("llama-2-7b", "q,v,down", BaseWeights::Nf4);
    let peft = adapter_config(&p).unwrap();
    check_peft(&peft);
    assert_eq!(peft["r"], 16);
    assert_eq!(peft["lora_alpha"], 32.0);
    assert_eq!(peft["lora_dropout"], 0.0);
    // The planned LoRA dropout is the adapter's, written as its decimal reads.
    let dropped = Problem {
        workload: p.workload.clone().with_lora_dropout(0.1).unwrap(),
        ..p.clone()
    };
    assert_eq!(adapter_config(&dropped).unwrap()["lora_dropout"], 0.1);
    assert_eq!(
        peft["target_modules"],
        serde_json::json!(["down_proj", "q_proj", "v_proj"])
    );
    let best = plan(
        &p,
        Precision::Bf16Mixed,
        0,
        Offload::None,
        Offload::None,
        Checkpoint::None,
    );
    let bnb = bitsandbytes_config(&p, &best).unwrap();
    check_bitsandbytes(&bnb);
    assert_eq!(bnb["bnb_4bit_quant_type"], "nf4");
    assert_eq!(bnb["bnb_4bit_compute_dtype"], "bfloat16");
    // GPT-2: q names the fused c_attn; the attention output needs its parent, because the MLP's
    // output projection is also called c_proj and is not adapted; Conv1D stores (in, out).
    let p = lora_problem("gpt2", "q,o", BaseWeights::Plain);
    let peft = adapter_config(&p).unwrap();
    check_peft(&peft);
    assert_eq!(
        peft["target_modules"],
        serde_json::json!(["attn.c_proj", "c_attn"])
    );
    assert_eq!(peft["fan_in_fan_out"], true);
    // A plain LoRA plan has no quantization to configure, and a plan without LoRA no adapters.
    let best = plan(
        &p,
        Precision::Bf16Mixed,
        0,
        Offload::None,
        Offload::None,
        Checkpoint::None,
    );
    let e = bitsandbytes_config(&p, &best).unwrap_err().to_string();
    assert!(e.contains("--lora-base nf4"), "{e}");
    let plain = problem("gpt2", "A100-80GB", 1, 1, 512, 8);
    let e = adapter_config(&plain).unwrap_err().to_string();
    assert!(e.contains("--lora-rank"), "{e}");
}

#[test]
fn torchtune_overrides_name_the_recipes_keys_or_refuse_what_it_cannot_run() {
    use headroom_plan::export::torchtune::torchtune_config;
    use headroom_plan::strategy::{BaseWeights, Lora};
    use support::schemas::check_torchtune;
    let with_lora = |targets: &str, base: BaseWeights| {
        let p = problem("llama-2-7b", "RTX-4090", 1, 1, 512, 8);
        let lora = Lora::new(8, 16.0, targets.parse().unwrap(), base).unwrap();
        let w = p.workload.clone().with_lora(&p.spec, lora).unwrap();
        Problem::new(p.spec, p.hardware, w, p.cost)
    };
    let strategy = |optimizer, checkpoint, loss| Strategy {
        precision: Precision::Bf16,
        optimizer,
        placement: Placement::default(),
        checkpoint,
        attention: Attention::MemoryEfficient,
        loss,
        optimizer_in_backward: false,
        micro_batch: 2,
        accumulation: 4,
    };
    // QLoRA on the attention and the whole MLP, paged 8-bit, every layer checkpointed, 8 chunks.
    let p = with_lora("q,v,gate,up,down", BaseWeights::Nf4);
    let s = strategy(
        Optimizer::PagedAdamW8bit,
        Checkpoint::ALL_BLOCKS,
        Loss::Chunked(8),
    );
    let keys = check_torchtune(&torchtune_config(&p, &evaluate(&p, &s)).unwrap());
    assert_eq!(
        keys["model._component_"],
        "torchtune.models.llama2.qlora_llama2_7b"
    );
    assert_eq!(keys["model.lora_attn_modules"], "[q_proj, v_proj]");
    assert_eq!(keys["model.apply_lora_to_mlp"], "True");
    assert_eq!(
        (
            keys["model.lora_rank"].as_str(),
            keys["model.lora_alpha"].as_str()
        ),
        ("8", "16")
    );
    assert_eq!(keys["model.lora_dropout"], "0.0");
    // The planned LoRA dropout is the recipe's.
    let dropped = Problem {
        workload: p.workload.clone().with_lora_dropout(0.05).unwrap(),
        ..p.clone()
    };
    let dropped_keys =
        check_torchtune(&torchtune_config(&dropped, &evaluate(&dropped, &s)).unwrap());
    assert_eq!(dropped_keys["model.lora_dropout"], "0.05");
    assert_eq!(
        keys["optimizer._component_"],
        "bitsandbytes.optim.PagedAdamW8bit"
    );
    assert_eq!(keys["enable_activation_checkpointing"], "True");
    assert_eq!(
        keys["loss._component_"],
        "torchtune.modules.loss.CEWithChunkedOutputLoss"
    );
    // The recipe compiles exactly when the plan's step time assumed it.
    assert_eq!(keys["compile"], "False");
    let compiled = p.clone().with_compile(true);
    let keys = check_torchtune(&torchtune_config(&compiled, &evaluate(&compiled, &s)).unwrap());
    assert_eq!(keys["compile"], "True");
    assert_eq!(
        (
            keys["batch_size"].as_str(),
            keys["gradient_accumulation_steps"].as_str()
        ),
        ("2", "4")
    );
    // What the recipes cannot express is refused with the flag that would make it expressible.
    let refused = |p: &Problem, s: &Strategy, hint: &str| {
        let e = torchtune_config(p, &evaluate(p, s))
            .unwrap_err()
            .to_string();
        assert!(e.contains(hint), "{e}");
    };
    let p = with_lora("q,down", BaseWeights::Plain);
    refused(
        &p,
        &strategy(Optimizer::AdamW, Checkpoint::None, Loss::Plain),
        "gate,up,down",
    );
    let p = with_lora("q,v", BaseWeights::Plain);
    refused(
        &p,
        &strategy(Optimizer::AdamW, Checkpoint::EveryNth(4), Loss::Plain),
        "--checkpoint all",
    );
    refused(
        &p,
        &strategy(Optimizer::Lamb, Checkpoint::None, Loss::Plain),
        "--optimizer adamw",
    );
    refused(
        &p,
        &strategy(Optimizer::AdamW, Checkpoint::None, Loss::Chunked(4)),
        "chunked:8",
    );
    let mixed = Strategy {
        precision: Precision::Bf16Mixed,
        ..strategy(Optimizer::AdamW, Checkpoint::None, Loss::Plain)
    };
    refused(&p, &mixed, "--precision bf16");
    let eight = problem("llama-2-7b", "A100-80GB", 8, 1, 512, 64);
    refused(
        &eight,
        &strategy(Optimizer::AdamW, Checkpoint::None, Loss::Plain),
        "8 GPUs",
    );
}
