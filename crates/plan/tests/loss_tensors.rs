//! The loss's vocabulary-sized tensors, against counts listed by hand from the code that runs
//! them: Hugging Face's `ForCausalLMLoss` (`logits.float()`, then `F.cross_entropy` =
//! `log_softmax` + `nll_loss`) on the compute-dtype logits the model returns, and
//! a loop that computes fp32 logits and releases them before backward (torchtune, torchtitan),
//! and a benchmark loop's `logits.sum()` (no cross-entropy).

use crate::support;

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
fn hugging_faces_loss_holds_twelve_bytes_per_token_and_entry_at_its_backward_peak() {
    // At the loss's backward peak, per token per vocabulary entry: the fp32 log-probabilities
    // log_softmax saved (4), nll_loss's fp32 gradient of them (4) and log_softmax's fp32
    // gradient of the logits (4): 12, under bf16 and fp32 alike. The model's logits and their
    // fp32 copy are saved by no node and released with the model's output before backward
    // (Trainer.compute_loss returns the loss alone). The first is held from forward on
    // (activations), the gradients exist in backward.
    let spec = &gpt2(LossImpl::HuggingFace).spec;
    let (s, b) = (1024.0, 8.0);
    let held = activation::logits(spec, s, b, 2.0, Loss::Plain);
    let grads = activation::logits_grad(spec, s, b, 2.0, Loss::Plain);
    assert_eq!(held, 4.0 * TOKENS * VOCAB);
    assert_eq!(grads, 8.0 * TOKENS * VOCAB);
}

#[test]
fn the_plan_charges_the_loss_tensors_at_the_backward_peak() {
    for precision in [Precision::Bf16, Precision::Fp32] {
        let s = strategy(precision, Loss::Plain);
        let hf = evaluate(&gpt2(LossImpl::HuggingFace), &s).memory;
        let loop_ = evaluate(&gpt2(LossImpl::Separate), &s).memory;
        let in_place = evaluate(&gpt2(LossImpl::InPlace), &s).memory;
        let at = |m: &headroom_plan::cost::MemoryPrediction, c| m.breakdown.at_peak[c] as f64;
        // The two fp32 gradients of eager F.cross_entropy, 8 bytes, are the backward's
        // transient workspace at the loss's node, whether Hugging Face's loss or a loop's own
        // calls it; Megatron-LM's in-place loss allocates none.
        assert_eq!(at(&hf, Category::Temporary), 8.0 * TOKENS * VOCAB);
        assert_eq!(at(&loop_, Category::Temporary), 8.0 * TOKENS * VOCAB);
        assert_eq!(at(&in_place, Category::Temporary), 0.0);
        // Held from forward: the saved fp32 log-probabilities in both; transformers' GPT-2
        // blocks add their Python GELU's three FFN-wide tensors (0.5·x, tanh, 1 + tanh) at e
        // bytes, 12 blocks of 8,192 tokens × 3,072, and under SDPA the KV cache's copies of K
        // and V beside the fused projection, 2·e·8,192·768 per block.
        let e = precision.activation_bytes() as f64;
        let extra = at(&hf, Category::Activation) - at(&loop_, Category::Activation);
        let want = 12.0 * (3.0 * e * TOKENS * 3072.0 + 2.0 * e * TOKENS * 768.0);
        assert_eq!(extra, want, "{precision:?}");
    }
}

#[test]
fn a_sum_of_the_logits_holds_them_and_allocates_one_gradient_at_the_compute_width() {
    // A benchmark's `out = model(...); out.logits.sum().backward()` runs no cross-entropy: the
    // model's logits stay at the compute width e, held by `out` (e·sbv); SumBackward0 saves
    // nothing and returns the seed expanded (zero strides), which the output projection's mm
    // clones contiguous for cuBLAS, one at a time: e·sbv in backward. bf16, e = 2: 2·sbv held
    // and 2·sbv allocated; fp32, e = 4: 4 and 4. A loop's F.cross_entropy holds 4·sbv (fp32
    // log-probabilities) whatever e, so the sum holds (4 − e)·sbv less.
    let at = |m: &headroom_plan::cost::MemoryPrediction, c| m.breakdown.at_peak[c] as f64;
    for precision in [Precision::Bf16, Precision::Fp32] {
        let e = precision.activation_bytes() as f64;
        let spec = &gpt2(LossImpl::Sum).spec;
        assert_eq!(
            activation::logits(spec, 1024.0, 8.0, e, Loss::Plain),
            e * TOKENS * VOCAB
        );
        assert_eq!(
            activation::logits_grad(spec, 1024.0, 8.0, e, Loss::Plain),
            e * TOKENS * VOCAB
        );
        let s = strategy(precision, Loss::Plain);
        let sum = evaluate(&gpt2(LossImpl::Sum), &s).memory;
        let loop_ = evaluate(&gpt2(LossImpl::Separate), &s).memory;
        assert_eq!(at(&sum, Category::Temporary), e * TOKENS * VOCAB);
        let less = at(&loop_, Category::Activation) - at(&sum, Category::Activation);
        assert_eq!(less, (4.0 - e) * TOKENS * VOCAB, "{precision:?}");
    }
}

#[test]
fn a_chunked_loss_holds_and_allocates_a_kth() {
    // A loss in 8 chunks computes one chunk's fp32 logits at a time: 4·sbv/8 held and the
    // chunk's two fp32 gradients, 8·sbv/8, whatever the implementation.
    let s = strategy(Precision::Bf16, Loss::Chunked(8));
    let hf = evaluate(&gpt2(LossImpl::HuggingFace), &s).memory;
    let loop_ = evaluate(&gpt2(LossImpl::Separate), &s).memory;
    for m in [&hf, &loop_] {
        assert_eq!(
            m.breakdown.at_peak[Category::Temporary] as f64,
            8.0 * TOKENS * VOCAB / 8.0
        );
    }
}

#[test]
fn qlora_of_llama_3_1_8b_at_7500_tokens_no_longer_fits_a_24_gb_card() {
    // The Unsloth baseline (Hugging Face + PEFT + bitsandbytes, FA2, gradient checkpointing,
    // 8-bit AdamW) runs out of memory beyond about 5,800 tokens on 24 GB. At 7,500 tokens the
    // loss alone holds 12·7,500·128,256 bytes = 10.8 GiB, which the 8 bytes counted before
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
    // At the loss's node: the two fp32 gradients, 8·7,500·128,256 bytes.
    assert_eq!(
        hf.memory.breakdown.at_peak[Category::Temporary] as f64,
        8.0 * 7500.0 * 128_256.0
    );
}

/// pythia-410m (GPT-NeoX: 24 blocks, hidden 1,024, 16 heads of 64, vocabulary 50,304) under a
/// benchmark loop's `logits.sum()`, transformers' own modules, one sequence of 2,048 tokens.
fn pythia_benchmark(use_cache: bool) -> Problem {
    let path = format!("{}/pythia-410m.json", support::published::DATA);
    let mut p = problem(&path, "A100-80GB", 1, 1, 2048, 1).with_loss_impl(LossImpl::Sum);
    p.spec.transformers_modules = true;
    p.spec.kv_cache_in_training = use_cache;
    p
}

#[test]
fn a_benchmark_loop_ends_the_next_forward_holding_the_previous_output_and_its_cache() {
    // `out = model(**inputs); out.logits.sum().backward()` in a loop releases the previous
    // `out` only when the next forward has returned: at the output projection it still holds
    // the previous 16-bit logits, 2·2,048·50,304 = 206,045,184 bytes, and the key/value cache a
    // decoder returns from a training forward (`use_cache`), K and V of 2,048 × 1,024 fp16 in
    // each of 24 blocks: 2·2·2,048·1,024·24 = 201,326,592 bytes. Gradient checkpointing turns
    // the cache off; a loop that keeps only the loss keeps nothing.
    let (logits, cache) = (206_045_184.0, 201_326_592.0);
    let spec = &pythia_benchmark(true).spec;
    let held = |spec, policy| activation::previous_outputs(spec, 2048.0, 1.0, 2.0, policy);
    assert_eq!(held(spec, Checkpoint::None), logits + cache);
    assert_eq!(held(spec, Checkpoint::ALL_BLOCKS), logits);
    let trainer = pythia_benchmark(true).with_loss_impl(LossImpl::HuggingFace);
    assert_eq!(held(&trainer.spec, Checkpoint::None), 0.0);

    // The plan's peak is that moment: the loss's node's activations with the previous output
    // in place of the logits' gradient (the same 2·sbv), so the cache is the whole difference
    // a model that returns none makes, to the byte.
    let s = Strategy {
        micro_batch: 1,
        ..strategy(Precision::Bf16, Loss::Plain)
    };
    let with = evaluate(&pythia_benchmark(true), &s).memory;
    let without = evaluate(&pythia_benchmark(false), &s).memory;
    let allocated = |m: &headroom_plan::cost::MemoryPrediction| {
        (m.breakdown.at_peak.total() - m.breakdown.at_peak[Category::Other]) as f64
    };
    assert_eq!(
        with.breakdown.at_peak[Category::Temporary] as f64,
        logits + cache
    );
    assert_eq!(allocated(&with) - allocated(&without), cache);
}

#[test]
fn a_loop_that_keeps_the_models_output_holds_its_logits_through_backward() {
    // `outputs = model(**batch); outputs.loss.backward()` keeps the model's bf16 logits in
    // `outputs` through backward, where the Trainer's `compute_loss` returns the loss alone:
    // 2·8·1,024·50,257 = 823,410,688 bytes more at the loss's backward peak, held, the loss's
    // own tensors unchanged. Into the next step the previous output also holds GPT-2's cache,
    // K and V of 8·1,024 × 768 bf16 in 12 blocks: 2·2·8,192·768·12 = 301,989,888 bytes.
    let logits = 2.0 * TOKENS * VOCAB;
    assert_eq!(logits, 823_410_688.0);
    let s = strategy(Precision::Bf16, Loss::Plain);
    let trainer = gpt2(LossImpl::HuggingFace);
    let kept = gpt2(LossImpl::HuggingFace).with_outputs_kept(true);
    let (s_, b_) = (1024.0, 8.0);
    assert_eq!(activation::kept_logits(&trainer.spec, s_, b_, 2.0), 0.0);
    assert_eq!(activation::kept_logits(&kept.spec, s_, b_, 2.0), logits);
    assert_eq!(
        activation::previous_outputs(&kept.spec, s_, b_, 2.0, Checkpoint::None),
        logits + 301_989_888.0
    );
    let at = |m: &headroom_plan::cost::MemoryPrediction, c| m.breakdown.at_peak[c] as f64;
    let (a, b) = (evaluate(&trainer, &s).memory, evaluate(&kept, &s).memory);
    assert_eq!(
        at(&b, Category::Activation) - at(&a, Category::Activation),
        logits
    );
    assert_eq!(at(&b, Category::Temporary), at(&a, Category::Temporary));
}

#[test]
fn at_the_optimizer_step_the_kept_output_is_still_there() {
    // One sequence of 128 tokens in fp32: AdamW's step, its foreach copy beside the states, is
    // the peak, and a loop that keeps `outputs` still holds this step's logits and cache there:
    // 4·128·50,257 = 25,731,584 bytes of logits, 2·4·128·768·12 = 9,437,184 of cache.
    let p = problem("gpt2", "A100-80GB", 1, 1, 128, 1).with_loss_impl(LossImpl::HuggingFace);
    let s = Strategy {
        micro_batch: 1,
        ..strategy(Precision::Fp32, Loss::Plain)
    };
    let m = evaluate(&p.clone().with_outputs_kept(true), &s).memory;
    assert_eq!(
        m.peak_phase,
        headroom_plan::cost::memory::Phase::OptimizerStep
    );
    assert_eq!(
        m.breakdown.at_peak[Category::Activation] as f64,
        25_731_584.0 + 9_437_184.0
    );
    let trainer = evaluate(&p, &s).memory;
    assert_eq!(trainer.breakdown.at_peak[Category::Activation], 0);
}
