//! Activation offload in the exports: DeepSpeed's `activation_checkpointing.cpu_checkpointing`,
//! torchtune's `enable_activation_offloading`, and Accelerate's refusal with the peak it would
//! reach instead; every emitted key checked against the tool's documented schema
//! (tests/support/schemas.rs).

use crate::support;

use headroom_memory::format_bytes;
use headroom_plan::cost::evaluate;
use headroom_plan::export::{ExportOptions, accelerate::accelerate_config, deepspeed::ds_config};
use headroom_plan::strategy::{Checkpoint, Framework, Offload, Placement, Precision, Strategy};
use support::schemas::check_deepspeed;
use support::{plan, problem};

#[test]
fn activation_offload_is_cpu_checkpointing_in_deepspeed_and_refused_by_accelerate() {
    use headroom_plan::export::torchtune::torchtune_config;
    use support::schemas::check_torchtune;
    // A fused optimizer step, so that the peak is in backward, where the checkpoints are.
    let p = problem("llama-2-7b", "A100-80GB", 8, 1, 4096, 8)
        .with_optimizer_impl(headroom_plan::strategy::OptimizerImpl::Fused);
    let kept = plan(
        &p,
        Precision::Bf16Mixed,
        3,
        Offload::None,
        Offload::None,
        Checkpoint::ALL_BLOCKS,
    );
    let offloaded = evaluate(
        &p,
        &Strategy {
            placement: Placement {
                offload_activations: Offload::Cpu,
                ..kept.strategy.placement
            },
            ..kept.strategy
        },
    );
    let opts = ExportOptions::default();
    let ds = ds_config(&p, &offloaded, &opts).unwrap();
    check_deepspeed(&ds);
    assert_eq!(ds["activation_checkpointing"]["cpu_checkpointing"], true);
    // Without the lever the section is absent (DeepSpeed's default keeps checkpoints on the GPU).
    assert!(ds_config(&p, &kept, &opts).unwrap()["activation_checkpointing"].is_null());
    // 32 layers of Llama-2-7B at micro-batch 1 × 4096 tokens: each checkpoint is
    // 4096 · 4096 · 2 bytes = 32 MiB, 31 of them leave the GPU.
    let extra = kept.memory.per_device_peak_bytes - offloaded.memory.per_device_peak_bytes;
    let moved = 31u64 * 4096 * 4096 * 2;
    assert!(extra >= moved, "{extra} < {moved}");
    let e = accelerate_config(&p, &offloaded, &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cpu_checkpointing")
            && e.contains(&format_bytes(extra))
            && e.contains("--offload-activations none"),
        "{e}"
    );
    // torchtune's single-device recipe: its own switch.
    let one = problem("llama-3.2-3b", "RTX-4090", 1, 1, 2048, 4).with_framework(Framework::Fsdp);
    let single = Strategy {
        precision: Precision::Bf16,
        placement: Placement {
            offload_activations: Offload::Cpu,
            ..Placement::default()
        },
        ..offloaded.strategy
    };
    let keys = check_torchtune(&torchtune_config(&one, &evaluate(&one, &single)).unwrap());
    assert_eq!(keys["enable_activation_offloading"], "True");
}
