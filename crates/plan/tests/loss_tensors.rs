//! The loss's vocabulary-sized tensors, against counts listed by hand from the code that runs
//! them: Hugging Face's `ForCausalLMLoss` (`logits.float()`, then `F.cross_entropy` =
//! `log_softmax` + `nll_loss`) on the compute-dtype logits the model returns and keeps, against
//! a loop that computes fp32 logits and releases them before backward (torchtune, torchtitan).

mod support;

use headroom_plan::cost::{Problem, activation, evaluate};
use headroom_plan::strategy::{
    Attention, BaseWeights, Category, Checkpoint, Framework, Lora, Loss, LossImpl, Offload,
    Optimizer, OptimizerImpl, Placement, Precision, Strategy, ZeroStage,
};
use support::{plain_strategy, problem};

// GPT-2 (vocabulary 50,257) at 8 sequences of 1,024 tokens on one A100-80GB.
const TOKENS: f64 = 8.0 * 1024.0;
const VOCAB: f64 = 50_257.0;

fn gpt2(loss_impl: LossImpl) -> Problem {
    problem("gpt2", "A100-80GB", 1, 1, 1024, 8).with_loss_impl(loss_impl)
}

fn strategy(precision: Precision, loss: Loss) -> Strategy {
    Strategy {
        attention: Attention::MemoryEfficient,
        loss,
        ..plain_strategy(precision, 8, 1)
    }
}

#[test]
fn hugging_faces_loss_holds_fourteen_bytes_per_token_and_entry_under_bf16() {
    // At the loss's backward peak, per token per vocabulary entry: the model's bf16 logits
    // (2, kept in the output), the fp32 log-probabilities log_softmax saved (4), nll_loss's
    // fp32 gradient of them (4) and log_softmax's fp32 gradient of the logits (4): 14. The
    // first two are held from forward on (activations), the gradients exist in backward.
    let spec = &gpt2(LossImpl::HuggingFace).spec;
    let (s, b) = (1024.0, 8.0);
    let held = activation::logits(spec, s, b, 2.0, Loss::Plain);
    let grads = activation::logits_grad(spec, s, b, Loss::Plain);
    assert_eq!(held, 6.0 * TOKENS * VOCAB);
    assert_eq!(grads, 8.0 * TOKENS * VOCAB);
    // fp32 training: `float()` returns the logits themselves, 4 + 4 + 4 + 4.
    assert_eq!(
        activation::logits(spec, s, b, 4.0, Loss::Plain) + grads,
        16.0 * TOKENS * VOCAB
    );
}

#[test]
fn the_plan_charges_hugging_faces_loss_tensors_at_the_backward_peak() {
    for (precision, e) in [(Precision::Bf16, 2.0), (Precision::Fp32, 4.0)] {
        let s = strategy(precision, Loss::Plain);
        let hf = evaluate(&gpt2(LossImpl::HuggingFace), &s).memory;
        let loop_ = evaluate(&gpt2(LossImpl::Separate), &s).memory;
        let at = |m: &headroom_plan::cost::MemoryPrediction, c| m.breakdown.at_peak[c] as f64;
        // The two fp32 gradients, 8 bytes, are the backward's transient workspace (no naive
        // attention scores compete with them); the training loop's own loss allocates one.
        assert_eq!(at(&hf, Category::Temporary), 8.0 * TOKENS * VOCAB);
        assert_eq!(at(&loop_, Category::Temporary), 4.0 * TOKENS * VOCAB);
        // Held from forward: the model's logits in the compute dtype besides the saved fp32
        // log-probabilities, e more bytes than the loop that dropped its logits.
        let extra = at(&hf, Category::Activation) - at(&loop_, Category::Activation);
        assert!(
            (extra - e * TOKENS * VOCAB).abs() <= 1.0,
            "{precision:?}: {extra}"
        );
    }
}

#[test]
fn a_chunked_loss_and_the_other_implementations_keep_their_fp32_logits_count() {
    // A loss in 8 chunks computes one chunk's fp32 logits at a time: 4·sbv/8 held and 4·sbv/8
    // of gradient, whatever the implementation.
    let s = strategy(Precision::Bf16, Loss::Chunked(8));
    let hf = evaluate(&gpt2(LossImpl::HuggingFace), &s).memory;
    let loop_ = evaluate(&gpt2(LossImpl::Separate), &s).memory;
    assert_eq!(hf.per_device_peak_bytes, loop_.per_device_peak_bytes);
    assert_eq!(
        hf.breakdown.at_peak[Category::Temporary] as f64,
        4.0 * TOKENS * VOCAB / 8.0
    );
    // Megatron-LM's in-place loss allocates no gradient beside its saved softmax.
    let in_place = evaluate(
        &gpt2(LossImpl::InPlace),
        &strategy(Precision::Bf16, Loss::Plain),
    );
    assert_eq!(in_place.memory.breakdown.at_peak[Category::Temporary], 0);
}

#[test]
fn qlora_of_llama_3_1_8b_at_7500_tokens_no_longer_fits_a_24_gb_card() {
    // The Unsloth baseline (Hugging Face + PEFT + bitsandbytes, FA2, gradient checkpointing,
    // 8-bit AdamW) runs out of memory beyond about 5,800 tokens on 24 GB. At 7,500 tokens the
    // loss alone holds 14·7,500·128,256 bytes = 12.5 GiB, which the 8 bytes counted before
    // (7.2 GiB) left room for.
    let p = problem("llama-3.1-8b", "RTX-4090", 1, 1, 7500, 1);
    let lora = Lora::new(32, 32.0, "all-linear".parse().unwrap(), BaseWeights::Nf4).unwrap();
    let workload = p.workload.clone().with_lora(&p.spec, lora).unwrap();
    let s = Strategy {
        precision: Precision::Bf16Mixed,
        optimizer: Optimizer::AdamW8bit,
        placement: Placement {
            zero_stage: ZeroStage::new(0).unwrap(),
            offload_optimizer: Offload::None,
            offload_params: Offload::None,
            offload_activations: Offload::None,
        },
        checkpoint: Checkpoint::ALL_BLOCKS,
        attention: Attention::MemoryEfficient,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch: 1,
        accumulation: 1,
    };
    let plan_with = |loss_impl| {
        let p = Problem::new(p.spec.clone(), p.hardware.clone(), workload.clone(), p.cost)
            .with_framework(Framework::Fsdp)
            .with_optimizer_impl(OptimizerImpl::PerTensor)
            .with_loss_impl(loss_impl);
        evaluate(&p, &s)
    };
    let hf = plan_with(LossImpl::HuggingFace);
    assert!(
        !hf.fits,
        "predicted {} of {} usable bytes",
        hf.memory.per_device_peak_bytes, hf.memory.usable_bytes
    );
    // The difference from a loop's own fp32 loss is the model's bf16 logits and the second
    // fp32 gradient, 2 + 4 bytes per token per entry, plus the fragmentation reserve on them.
    let loop_ = plan_with(LossImpl::Separate);
    let extra = hf.memory.per_device_peak_bytes as f64 - loop_.memory.per_device_peak_bytes as f64;
    let expected = 6.0 * 7500.0 * 128_256.0 * (1.0 + p.cost.fragmentation);
    assert!((extra - expected).abs() <= 2.0, "{extra} vs {expected}");
}
