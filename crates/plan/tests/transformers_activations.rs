//! What transformers' eager modules hold beyond the per-block terms of a fused implementation,
//! each derived by hand from the module's code: GPT-2's KV cache in training under SDPA, and
//! eager attention's mask kept by checkpointed blocks.

use headroom_plan::cost::Width;
use headroom_plan::cost::activation;
use headroom_plan::model::{Architecture, load_model};
use headroom_plan::strategy::{Attention, Checkpoint, Loss};

fn held(spec: &Architecture, e: f64, attention: Attention, policy: Checkpoint) -> f64 {
    activation::held_at_backward_start(spec, 1024.0, 8.0, e, attention, policy, Loss::Plain)
}

#[test]
fn gpt2_under_sdpa_holds_its_kv_cache_copies_beside_the_fused_projection() {
    // GPT-2 (12 blocks, width 768) at 8 × 1,024 tokens in bf16 with `use_cache` (the config's
    // default): SDPA saves the query as a view of c_attn's output, keeping K and V alive, and
    // the DynamicCache's torch.cat copies of K and V it reads: 2·2·T·768 more bytes per block.
    let cached = load_model("gpt2").unwrap();
    let uncached = Architecture {
        kv_cache_in_training: false,
        ..cached.clone()
    };
    let t = 8.0 * 1024.0;
    let extra = held(&cached, 2.0, Attention::MemoryEfficient, Checkpoint::None)
        - held(&uncached, 2.0, Attention::MemoryEfficient, Checkpoint::None);
    assert_eq!(extra, 12.0 * 2.0 * 2.0 * t * 768.0);
    // Eager attention's matmuls save the copies instead of the views, and checkpointing turns
    // the cache off: nothing more.
    for (attention, policy) in [
        (Attention::Naive, Checkpoint::None),
        (Attention::MemoryEfficient, Checkpoint::ALL_BLOCKS),
    ] {
        assert_eq!(
            held(&cached, 2.0, attention, policy),
            held(&uncached, 2.0, attention, policy)
        );
    }
}

#[test]
fn checkpointed_eager_blocks_keep_the_additive_mask() {
    // Llama-3-8B, every block checkpointed, 8 sequences of 1,024 tokens, pure bf16: under
    // eager attention every block's checkpoint keeps the one (b, 1, s, s) bf16 mask,
    // 2·8·1,024² bytes; SDPA takes `is_causal` and no mask.
    let spec = load_model("llama-3-8b").unwrap();
    let eager = held(&spec, 2.0, Attention::Naive, Checkpoint::ALL_BLOCKS);
    let sdpa = held(
        &spec,
        2.0,
        Attention::MemoryEfficient,
        Checkpoint::ALL_BLOCKS,
    );
    // The block inputs and the terms outside the blocks do not depend on the attention.
    assert_eq!(eager - sdpa, 2.0 * 8.0 * 1024.0 * 1024.0);
}

#[test]
fn gpt2_gelu_new_under_autocast_saves_pow_input_and_the_tanh_chain_in_fp32() {
    // GPT-2's Python gelu_new, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), keeps beyond a fused
    // GELU (its input and output at the compute width): pow's saved input, 0.5·x, tanh and
    // 1 + tanh, less the input it replaces. Pure bf16: 0 + 2 + 2 + 2 = 6 bytes per FFN element.
    // Under autocast CUDA runs pow in fp32 (its fp32 list), so pow saves an fp32 copy of x and
    // the chain is fp32 up to the product: (4 − 2) + 2 + 4 + 4 = 12.
    let python = load_model("gpt2").unwrap();
    let fused = Architecture {
        python_gelu: false,
        ..python.clone()
    };
    let (s, b) = (1024.0, 8.0);
    let sbf = s * b * 3072.0;
    let extra = |w: Width| {
        activation::block(&python, s, b, w, Attention::MemoryEfficient).full()
            - activation::block(&fused, s, b, w, Attention::MemoryEfficient).full()
    };
    let autocast = Width {
        e: 2.0,
        softmax: 4.0,
        residual: 2.0,
    };
    assert_eq!(extra(Width::from(2.0)), 6.0 * sbf);
    assert_eq!(extra(autocast), 12.0 * sbf);
}

#[test]
fn sdpa_on_grouped_query_heads_in_fp32_is_planned_as_its_math_path() {
    use crate::support::{plain_strategy, problem};
    use headroom_plan::advice::explain;
    use headroom_plan::cost::evaluate;
    use headroom_plan::strategy::{Category, Framework, Precision, Strategy};
    // Llama-3-8B (32 query heads over 8 key/value heads) at 1 × 4,096 tokens on one H100. In
    // fp32 no fused SDPA kernel takes its grouped heads (flash is 16-bit only, the
    // memory-efficient kernel needs equal heads), so SDPA's math path keeps the probabilities
    // as eager attention does: the same bytes and time as naive attention. In bf16 autocast
    // flash runs, and a model with equal heads (Llama-2-7B) runs the fused kernel in fp32.
    let at = |model: &str, precision: Precision, attention: Attention| {
        let p = problem(model, "H100-80GB", 1, 1, 4096, 1);
        let s = Strategy {
            attention,
            ..plain_strategy(precision, 1, 1)
        };
        (evaluate(&p, &s), p)
    };
    let (sdpa, p) = at("llama-3-8b", Precision::Fp32, Attention::MemoryEfficient);
    let (naive, _) = at("llama-3-8b", Precision::Fp32, Attention::Naive);
    assert_eq!(
        sdpa.memory.per_device_peak_bytes,
        naive.memory.per_device_peak_bytes
    );
    assert_eq!(sdpa.time.step_s, naive.time.step_s);
    assert_eq!(sdpa.strategy.attention, Attention::MemoryEfficient);
    // With every block checkpointed, eager attention's blocks keep transformers' (b, 1, s, s)
    // additive mask until their backward, in fp32: 4 · 4,096² = 67,108,864 bytes. SDPA gets
    // `is_causal` and no mask, its math path included, so the plans differ by exactly that.
    let checkpointed = |attention| {
        let p = problem("llama-3-8b", "H100-80GB", 1, 1, 4096, 1).with_framework(Framework::Fsdp);
        let s = Strategy {
            attention,
            checkpoint: Checkpoint::ALL_BLOCKS,
            // Each gradient stepped and released in backward, so the peak is backward's.
            optimizer_in_backward: true,
            ..plain_strategy(Precision::Fp32, 1, 1)
        };
        evaluate(&p, &s).memory.breakdown.at_peak[Category::Activation]
    };
    assert_eq!(
        checkpointed(Attention::Naive) - checkpointed(Attention::MemoryEfficient),
        4 * 4096 * 4096
    );
    assert!(
        explain(&p, &sdpa)
            .iter()
            .any(|line| line.contains("math path"))
    );
    // Where a fused kernel runs, the s² probabilities of 32 heads × 4,096² in fp32 (2 GiB a
    // block) are not kept.
    for (model, precision) in [
        ("llama-3-8b", Precision::Bf16Mixed),
        ("llama-2-7b", Precision::Fp32),
    ] {
        let (fused, p) = at(model, precision, Attention::MemoryEfficient);
        let (naive, _) = at(model, precision, Attention::Naive);
        assert!(
            fused.memory.per_device_peak_bytes + (2u64 << 30) < naive.memory.per_device_peak_bytes,
            "{model} {precision:?}"
        );
        assert!(
            !explain(&p, &fused)
                .iter()
                .any(|line| line.contains("math path"))
        );
    }
}
