//! `headroom plan` with LoRA, run as the built binary: the frozen base's dtype as loaded and
//! the adapters' dropout, each counted in memory and refused without --lora-rank.

use crate::common;

use common::{headroom, json, stderr};

#[test]
fn the_lora_base_dtype_flag_counts_the_frozen_base_as_loaded() {
    // Llama-2-7B (6,738,415,616 parameters) with LoRA on q and v under FSDP bf16-mixed: loaded
    // in fp32, as PEFT's FSDP example does, the frozen base holds 2 more bytes per parameter
    // than the default bf16.
    let steady_parameters = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            "llama-2-7b",
            "--gpu",
            "A100-80GB",
            "--seq-len",
            "512",
            "--framework",
            "fsdp",
            "--precision",
            "bf16-mixed",
            "--optimizer",
            "adamw",
            "--zero",
            "0",
            "--micro-batch",
            "1",
            "--accumulation",
            "1",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q,v",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = headroom(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["recommended"]["memory"]["steady_by_category"]["parameter"]
            .as_u64()
            .unwrap()
    };
    let default = steady_parameters(&[]);
    let fp32 = steady_parameters(&["--lora-base-dtype", "fp32"]);
    assert_eq!(fp32 - default, 2 * 6_738_415_616);
    // Without --lora-rank the flag is refused by name.
    let o = headroom(&["plan", "--model", "gpt2", "--lora-base-dtype", "fp32"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--lora-rank"), "{}", stderr(&o));
}

#[test]
fn the_lora_dropout_flag_keeps_each_adapted_inputs_dropped_copy() {
    // Llama-2-7B with LoRA on q and v under DeepSpeed bf16-mixed (16-bit activations), 512
    // tokens, no checkpointing. Without dropout a block keeps the attention's input once for
    // both adapters (4,096 features, 2 bytes); with PEFT's per-module dropout q and v each keep
    // a dropped copy (2 bytes) and its 1-byte mask instead: 512·(2·4,096·3 − 4,096·2) =
    // 8,388,608 bytes a block, 268,435,456 over 32 blocks.
    let activations = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            "llama-2-7b",
            "--gpu",
            "A100-80GB",
            "--seq-len",
            "512",
            "--framework",
            "deepspeed",
            "--precision",
            "bf16-mixed",
            "--optimizer",
            "adamw",
            "--zero",
            "0",
            "--offload-optimizer",
            "none",
            "--offload-params",
            "none",
            "--offload-activations",
            "none",
            "--checkpoint",
            "none",
            "--attention",
            "memory-efficient",
            "--loss",
            "plain",
            "--micro-batch",
            "1",
            "--accumulation",
            "1",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q,v",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = headroom(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        json(&o)["recommended"]["memory"]["by_category"]["activation"]
            .as_u64()
            .unwrap()
    };
    let none = activations(&[]);
    let dropped = activations(&["--lora-dropout", "0.05"]);
    assert_eq!(dropped - none, 268_435_456);
    // A probability is needed, and a LoRA run.
    let o = headroom(&[
        "plan",
        "--model",
        "gpt2",
        "--gpu",
        "A100-80GB",
        "--seq-len",
        "512",
        "--lora-rank",
        "8",
        "--lora-dropout",
        "1.5",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("0 <= p < 1"), "{}", stderr(&o));
    let o = headroom(&["plan", "--model", "gpt2", "--lora-dropout", "0.1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--lora-rank"), "{}", stderr(&o));
}
