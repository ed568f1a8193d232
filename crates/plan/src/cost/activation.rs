//! Activation memory of a transformer block and of the whole model for one micro-batch, after
//! Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (arXiv
//! 2205.05198, §4, Table 2; docs/sources.md §9), generalised to GQA, gated
//! MLPs, MoE, byte widths other than 2, models without dropout, and memory-efficient attention.
//!
//! Per block, with `e` bytes per activation element, micro-batch `b`, sequence `s`, hidden `h`,
//! query width `q = heads·head_dim`, key/value width `kv`, FFN width `f`, `a` heads:
//!
//! | term | bytes | Korthikanti (e = 2, q = kv = h, f = 4h, dropout) |
//! |---|---|---|
//! | norm inputs | 2·e·sbh (4·e·sbh for Gemma 2) | 4sbh |
//! | QKV input, Q, K, V, output-projection input | e·sb·(h + q + kv + kv + q) | 10sbh |
//! | attention-output dropout mask | sbh (if dropout) | sbh |
//! | core attention, naive | e·as²b softmax + (as²b mask + e·as²b dropout output if dropout) | 5as²b |
//! | core attention, memory-efficient | 4·asb (fp32 log-sum-exp; LLM-Analysis) | — |
//! | MLP, plain | e·sbh + 2·e·sbf + sbh mask (if dropout); e·sbh + e·sbf where the activation's output is recomputed (headroom's engine) | 19sbh |
//! | MLP, gated (SwiGLU) | e·sbh + 4·e·sbf (gate out, act out, up out, product) | — |
//! | MoE | MLP expert part × experts_per_token + 4·sbE router logits | — |
//!
//! Under LoRA (`Architecture::lora_saves`) the inputs only a frozen projection's weight gradient
//! would read are not kept: the attention's input unless q/k/v are adapted, the output
//! projection's unless o is, the MLP's unless gate/up are, the activation's output (or the gated
//! product) unless down is, and the output head's; each adapter adds its rank-r intermediate.
//! With LoRA dropout none of those inputs is kept: each adapted projection keeps its own
//! dropped copy of its input and a one-byte mask.
//!
//! The 34·sbh + 5·as²b of Eq. 1 is reproduced exactly for GPT-style blocks (see tests).
//! T5 decoder blocks add a cross-attention costed like a self-attention plus a third norm. A
//! block without attention (headroom's residual MLP) keeps one norm input and the MLP terms.
//!
//! Not for: parameters, gradients or optimizer states (see `memory`).

use crate::model::lora::LoraSaves;
use crate::model::{Architecture, Family, MlpKind};
use crate::strategy::{Attention, Checkpoint, Loss};

pub use super::selective_op::{OpSelective, op_selective};
pub use super::width::Width;

/// The widths of a block, as floats: hidden `h`, query `q`, key/value `kv`, FFN `f`.
pub(super) fn dims(spec: &Architecture) -> (f64, f64, f64, f64) {
    (
        spec.hidden_size as f64,
        spec.q_dim() as f64,
        spec.kv_dim() as f64,
        spec.intermediate_size as f64,
    )
}

/// Bytes per element an RMSNorm saves beyond the input and output the norm terms count.
///
/// Llama's `LlamaRMSNorm` (and Mistral's, Mixtral's, Qwen2's, Phi-3's copies) computes
/// `x.to(float32)`, `x·rsqrt(mean(x²) + ε)`, `.to(input_dtype)` and the weight's product:
/// autograd saves the fp32 `x` (for `pow` and the product; a copy unless `x` is fp32) and the
/// normalised tensor in the input dtype (for the weight's gradient). Against the input (at the
/// residual width `r`) that is `4 − r` for the copy plus `r` for the normalised tensor: 4
/// bytes. Gemma's `GemmaRMSNorm` keeps the normalised tensor in fp32 (`output · (1 +
/// weight.float())`): `4 − r + 4`. LayerNorm (`native_layer_norm` saves its input and two
/// per-row statistics) adds nothing, and so do the fused or compiled RMSNorms of loops with
/// their own modules (torchtitan, torchtune under `torch.compile`), which save the input and the
/// per-row statistic only.
pub(super) fn norm_upcast(spec: &Architecture, w: Width) -> f64 {
    if !spec.transformers_modules {
        return 0.0;
    }
    match spec.family {
        Family::Llama
        | Family::Mistral
        | Family::Mixtral
        | Family::Qwen2
        | Family::Qwen2Moe
        | Family::Phi3 => 4.0,
        Family::Gemma | Family::Gemma2 => 8.0 - w.residual,
        Family::Gpt2 | Family::GptNeox | Family::Bert | Family::T5 | Family::ResMlp => 0.0,
    }
}

/// Bytes per element of the attention probabilities naive attention saves. The softmax runs in
/// fp32 where the model asks for it (`softmax(…, dtype=torch.float32).to(query.dtype)` in the
/// Llama-like models' and GPT-NeoX's `eager_attention_forward`; GPT-2's, BERT's and T5's keep
/// the scores' dtype) or autocast does (`w.softmax`), and the
/// cast back to the compute dtype, which the second matmul saves, is a second tensor (a
/// model with attention dropout saves the dropout's output instead, counted with the dropout).
pub(super) fn saved_probabilities(spec: &Architecture, w: Width) -> f64 {
    let fp32_softmax = spec.transformers_modules
        && !matches!(
            spec.family,
            Family::Gpt2 | Family::Bert | Family::T5 | Family::ResMlp
        );
    let softmax = if fp32_softmax { 4.0 } else { w.softmax };
    // With dropout the second matmul saves the dropout's output instead, which the dropout
    // terms count; the cast is then saved by nothing.
    match softmax > w.e && !spec.dropout {
        true => softmax + w.e,
        false => softmax,
    }
}

/// Bytes one block holds besides [`block`] when it runs without checkpointing: with a KV
/// cache in training (`Architecture::kv_cache_in_training`) and SDPA, GPT-2's attention saves
/// the query as a view of its fused q/k/v output, which keeps K and V alive beside the cache's
/// `torch.cat` copies that SDPA also saves: `2·e·sb·kv`. Eager attention's matmuls save
/// copies in place of the views, and checkpointing turns the cache off: nothing.
pub fn kv_cache_copies(spec: &Architecture, s: f64, b: f64, e: f64, attention: Attention) -> f64 {
    let fused_views = spec.family == Family::Gpt2;
    match spec.kv_cache_in_training
        && spec.transformers_modules
        && fused_views
        && attention == Attention::MemoryEfficient
    {
        true => 2.0 * e * s * b * spec.kv_dim() as f64,
        false => 0.0,
    }
}

/// Bytes held beside the checkpointed blocks' inputs by eager attention under checkpointing:
/// transformers builds one `(b, 1, s, s)` additive mask in the embeddings' dtype for eager
/// attention (`masking_utils.eager_mask`), and every checkpointed block keeps it as an input
/// until its backward (without checkpointing it is freed with the model's forward; SDPA without
/// padding takes `is_causal` and no mask). One mask for the model.
pub fn checkpointed_mask(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: Width,
    attention: Attention,
) -> f64 {
    match spec.transformers_modules && spec.has_attention() && attention == Attention::Naive {
        true => w.residual * b * s * s,
        false => 0.0,
    }
}

/// Bytes of activations one block stores for backward, for micro-batch `b`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockActivations {
    /// Everything except the s² core-attention terms.
    pub linear_part: f64,
    /// The core-attention terms (s² for naive attention, O(s) for memory-efficient).
    pub core_attention: f64,
    /// What a fully checkpointed block keeps: its input, `e·sbh`.
    pub input: f64,
}

impl BlockActivations {
    pub fn full(&self) -> f64 {
        self.linear_part + self.core_attention
    }
}

/// Activations of one block (averaged over encoder and decoder blocks for T5).
pub fn block(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
) -> BlockActivations {
    let w: Width = w.into();
    let e = w.e;
    let (h, q, kv, f) = dims(spec);
    let a = spec.num_heads as f64;
    let sb = s * b;
    let drop = if spec.dropout { 1.0 } else { 0.0 };

    // A block without attention (the residual MLP) has one norm and no attention terms.
    let attention_blocks = if spec.has_attention() { 1.0 } else { 0.0 };
    // Gemma 2 also normalises the MLP's input and output: two more norm inputs kept.
    let extra_norms = if spec.family == Family::Gemma2 {
        2.0
    } else {
        0.0
    };
    let norms =
        (1.0 + attention_blocks + extra_norms) * (w.residual + norm_upcast(spec, w)) * sb * h;
    // Under an fp32 residual stream each separate projection after a norm keeps its own
    // 16-bit cast of the norm's output: q, k and v apart (not fused), gate and up apart.
    let fused_qkv = matches!(spec.family, Family::Gpt2 | Family::GptNeox | Family::Phi3);
    let separate_gate_up = spec.mlp == MlpKind::Gated && spec.family != Family::Phi3;
    let (extra_qkv_casts, extra_mlp_casts) = match w.casts_norm_outputs() {
        true => (
            if fused_qkv { 0.0 } else { 2.0 },
            if separate_gate_up { 1.0 } else { 0.0 },
        ),
        false => (0.0, 0.0),
    };
    // Under LoRA a projection's input is kept only where an adapter reads it, and with LoRA
    // dropout not even there: the adapter saves its dropped copy instead (`adapters` below).
    let saves = spec.lora_saves;
    let keep = |needed: fn(&LoraSaves) -> bool| {
        saves.as_ref().map_or(1.0, |l| {
            f64::from(u8::from(needed(l) && l.dropout_features_per_block == 0.0))
        })
    };
    let (qkv_in, o_in) = (keep(|l| l.qkv_input), keep(|l| l.o_input));
    let (mlp_in, down_in) = (keep(|l| l.mlp_input), keep(|l| l.down_input));
    // Each adapter's rank-r intermediate; with LoRA dropout each adapted projection's dropped
    // input copy and its one-byte mask (`LoraSaves`).
    let adapters = saves.map_or(0.0, |l| {
        (l.adapters_per_block * l.rank * e + l.dropout_features_per_block * (e + 1.0)) * sb
    });
    // Eager attention multiplies by `repeat_kv`'s copies of K and V, expanded to every query
    // head (`eager_attention_forward` in each Llama-like model of transformers), and those
    // copies are what the matmuls save; SDPA without a mask takes K and V as they are
    // (`enable_gqa`, `transformers/integrations/sdpa_attention.py`).
    let kv_saved = match attention {
        Attention::Naive if spec.transformers_modules => q.max(kv),
        Attention::Naive => kv,
        Attention::MemoryEfficient => kv,
    };
    let attn_linear = attention_blocks
        * (e * sb * (h * qkv_in * (1.0 + extra_qkv_casts) + q + kv_saved + kv_saved + q * o_in)
            + drop * sb * h);
    let core = attention_blocks
        * match attention {
            Attention::Naive => {
                saved_probabilities(spec, w) * a * s * s * b
                    + drop * (a * s * s * b + e * a * s * s * b)
            }
            Attention::MemoryEfficient => 4.0 * a * s * b,
        };
    let k = spec.experts_per_token as f64;
    // A plain MLP keeps its input, its first matmul's output and the activation's output; the
    // last not where the engine recomputes it.
    // Under LoRA it is kept only for an adapter on the down projection (a frozen one needs
    // no input), recomputed or not.
    let act_out = match saves {
        Some(_) => down_in,
        None if spec.recomputed_mlp_activation => 0.0,
        None => 1.0,
    };
    // transformers' Python GELU (`gelu_new`: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))))
    // saves pow's input, 0.5·x, tanh and 1 + tanh. Under autocast CUDA runs `pow` in fp32 (its
    // fp32 list, aten/src/ATen/autocast_mode.h), so pow saves an fp32 copy of x rather than x,
    // and the chain after it is fp32 up to the product (softmax's width: 4 under autocast, else
    // e); 0.5·x stays in the compute dtype.
    let (act_in, gelu_parts) = match spec.python_gelu && spec.transformers_modules {
        true => (w.softmax, e + 2.0 * w.softmax),
        false => (e, 0.0),
    };
    let mlp = match spec.mlp {
        MlpKind::Plain => {
            e * sb * h * mlp_in + k * (act_in + act_out * e + gelu_parts) * sb * f + drop * sb * h
        }
        // Gate out, activation out and up out always; their product (down's input) as above.
        MlpKind::Gated => {
            e * sb * h * mlp_in * (1.0 + extra_mlp_casts) + k * (3.0 + down_in) * e * sb * f
        }
    };
    // A shared expert (Qwen2-MoE) keeps the same four intermediates at its own width, and its
    // one-output gate's logit.
    let shared = spec.shared_expert_size as f64;
    let mlp = match shared > 0.0 {
        true => mlp + (3.0 + down_in) * e * sb * shared + e * sb,
        false => mlp,
    };
    let router = if spec.num_experts > 1 {
        4.0 * sb * spec.num_experts as f64
    } else {
        0.0
    };

    let encoder = norms + attn_linear + mlp + router + adapters;
    let (linear_part, core_attention) = if spec.num_decoder_layers > 0 {
        // T5: decoder blocks carry a cross-attention and a third norm; average over all blocks.
        let decoder = encoder + attn_linear + w.residual * sb * h;
        let (ne, nd) = (spec.num_layers as f64, spec.num_decoder_layers as f64);
        (
            (ne * encoder + nd * decoder) / (ne + nd),
            core * (ne + 2.0 * nd) / (ne + nd),
        )
    } else {
        (encoder, core)
    };
    BlockActivations {
        linear_part,
        core_attention,
        input: w.residual * sb * h,
    }
}

/// Whole-model activation terms outside the blocks (Korthikanti §4.3 with p = 1): embedding
/// dropout mask `sbh`, final-norm input and output-projection input `2·e·sbh`, and the loss's
/// vocabulary-sized tensors held at the start of backward ([`logits`]).
pub fn outside_blocks(spec: &Architecture, s: f64, b: f64, w: impl Into<Width>, loss: Loss) -> f64 {
    let w: Width = w.into();
    let h = spec.hidden_size as f64;
    let drop = if spec.dropout { 1.0 } else { 0.0 };
    // A frozen output projection (LoRA) keeps no input for its weight's gradient.
    let head_in = if spec.lora_saves.is_some() { 0.0 } else { 1.0 };
    let final_norm = w.residual + norm_upcast(spec, w);
    drop * s * b * h + (final_norm + head_in * w.e) * s * b * h + logits(spec, s, b, w.e, loss)
}

/// The loss's vocabulary-sized tensors held at the start of backward.
///
/// Hugging Face's causal-LM models return `logits = lm_head(hidden)` in the compute dtype (bf16
/// under autocast, FSDP mixed precision or a 16-bit model); `ForCausalLMLoss`
/// (`transformers/loss/loss_utils.py`) calls `logits.float()` and `F.cross_entropy`, which is
/// `log_softmax` then `nll_loss` (PyTorch `aten/src/ATen/native/LossNLL.cpp`,
/// `cross_entropy_loss`). `log_softmax` saves its fp32 output for backward; neither the model's
/// logits nor their fp32 copy is saved by any node (`lm_head` saves its input, the cast saves
/// nothing), and the model's output that holds the logits is gone before backward:
/// `Trainer.compute_loss` returns the loss alone (`transformers/trainer.py`), as does a loop
/// that keeps `model(...).loss`. Held: the fp32 log-probabilities, `4sbv` whatever `e`. In
/// backward ([`logits_grad`]) `nll_loss_backward` allocates a zero-filled fp32 gradient of the
/// log-probabilities and `log_softmax_backward_data` a new fp32 gradient of the logits
/// (`grad − exp(out)·Σgrad`) while both are alive: 12 bytes per token per vocabulary entry at
/// the loss's peak, under fp32 and bf16 alike; the compute-dtype cast of the gradient that
/// follows is made after the saved output and the first gradient are released (`4 + e`, less).
/// In forward the loss passes through `e + 4 + 4` (logits, fp32 copy, log-probabilities), also
/// less.
///
/// Headroom's engine and the other loss implementations (a loop's own fp32 logits released
/// before backward, Megatron-LM's) hold the same fp32 log-probabilities `4sbv`, and a loss in K
/// chunks a K-th of them (the chunk's logits the first step of backward recomputes while every
/// other activation is held). MemTracker's count of transformers models agrees (the data and
/// test beside `crates/plan/tests/memtracker.rs`).
///
/// A benchmark loop that runs `out = model(...)` then `out.logits.sum().backward()`
/// (`Architecture::sum_loss`) computes no log-probabilities: `SumBackward0` saves only the
/// input's sizes (`tools/autograd/derivatives.yaml`, `sum`), and what stays is the model's
/// own logits at the compute width `e` (`e·sbv`), held by the output the loop keeps, through
/// all of backward; a chunked loss does not apply to it.
pub fn logits(spec: &Architecture, s: f64, b: f64, e: f64, loss: Loss) -> f64 {
    let tokens_by_vocab = s * b * spec.vocab_size as f64;
    if spec.sum_loss {
        return e * tokens_by_vocab;
    }
    4.0 * tokens_by_vocab / loss.chunks() as f64
}

/// The vocabulary-sized gradients the loss's backward allocates beside [`logits`] at its
/// peak, when the gradient is a new tensor (not `LossImpl::InPlace`). PyTorch's eager
/// `F.cross_entropy` on fp32 logits (Hugging Face's `ForCausalLMLoss`, torchtune's and
/// torchtitan's loops alike: `Architecture::upcasting_loss`) allocates two: `nll_loss_backward`'s
/// zero-filled fp32 gradient of the log-probabilities and `log_softmax_backward_data`'s fp32
/// gradient of the logits, `8sbv`; headroom's engine, whose loss writes the logits' gradient
/// only, `4sbv`. A loss in K chunks, a K-th.
///
/// `logits.sum()` (`Architecture::sum_loss`) allocates one logits-shaped gradient at the
/// compute width, `e·sbv`: its backward, `sum_backward`
/// (`torch/csrc/autograd/FunctionsManual.cpp`), returns the 0-d seed gradient expanded to the
/// logits' shape, a view with zero strides; the output projection's `mm`/`addmm` backward
/// hands that view to cuBLAS through `prepare_matrix_for_cublas`
/// (`aten/src/ATen/native/cuda/Blas.cpp`), which clones a matrix whose strides are neither
/// row- nor column-major into a contiguous one. The input's and the weight's gradient each
/// clone it in turn inside the same node, the first freed before the second: one at a time.
pub fn logits_grad(spec: &Architecture, s: f64, b: f64, e: f64, loss: Loss) -> f64 {
    let tokens_by_vocab = s * b * spec.vocab_size as f64;
    if spec.sum_loss {
        return e * tokens_by_vocab;
    }
    let per_entry = if spec.upcasting_loss { 8.0 } else { 4.0 };
    per_entry * tokens_by_vocab / loss.chunks() as f64
}

/// Number of blocks a policy recomputes among `n`: one in every `k` (rounded up) for `every:K`,
/// all of them for `sqrt`. A budget is resolved first (see [`effective_policy`]).
pub fn checkpointed_blocks(policy: Checkpoint, n: u64) -> u64 {
    match policy {
        Checkpoint::EveryNth(k) => n.div_ceil(k.max(1)),
        Checkpoint::Sqrt => n,
        Checkpoint::None
        | Checkpoint::Selective
        | Checkpoint::SelectiveOp
        | Checkpoint::Budget(_) => 0,
    }
}

/// The policy the analytical model charges for `policy`: `budget:SIZE` becomes the policy with
/// the least recomputation among none and every:K (K = n … 1) whose activations fit SIZE, or
/// every block when none does; selective recomputation with memory-efficient attention is
/// none (the fused kernel keeps no s² scores and already recomputes them in its backward, so
/// selective recomputation has nothing to drop or re-run: Korthikanti et al. §5 recompute the
/// core attention that FlashAttention never stores); other policies are themselves.
pub fn effective_policy(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
    policy: Checkpoint,
    loss: Loss,
) -> Checkpoint {
    let w: Width = w.into();
    if policy == Checkpoint::Selective && attention == Attention::MemoryEfficient {
        return Checkpoint::None;
    }
    let Checkpoint::Budget(budget) = policy else {
        return policy;
    };
    let n = spec.total_blocks();
    std::iter::once(Checkpoint::None)
        .chain((1..=n).rev().map(Checkpoint::EveryNth))
        .find(|&c| model_activations(spec, s, b, w, attention, c, loss) <= budget as f64)
        .unwrap_or(Checkpoint::ALL_BLOCKS)
}

/// The checkpointed inputs held at the start of backward, as (count, bytes of each): the input
/// of every checkpointed block under `every:K`, of every segment under `sqrt`, none for the
/// other policies. Activation offload moves these to the host; backward fetches one back at a
/// time, for the block it recomputes (DeepSpeed's `cpu_checkpointing` copies it back to the
/// device synchronously at the start of the block's backward).
pub fn checkpointed_inputs(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
    policy: Checkpoint,
    loss: Loss,
) -> (u64, f64) {
    let w: Width = w.into();
    let n = spec.total_blocks();
    let input = block(spec, s, b, w, attention).input;
    let resolved = effective_policy(spec, s, b, w, attention, policy, loss);
    let count = match resolved {
        Checkpoint::EveryNth(_) => checkpointed_blocks(resolved, n),
        Checkpoint::Sqrt if n > 0 => n.div_ceil(n.div_ceil((n as f64).sqrt().ceil() as u64)),
        _ => 0,
    };
    (count, input)
}

/// Activation bytes at the peak of a step's activations: everything held at the start of
/// backward ([`held_at_backward_start`]) plus what backward re-runs one block (or segment) at a
/// time ([`recomputed`]).
///
/// A checkpointed block keeps only its input; during its backward it is recomputed, so one
/// block's activations exist again, minus the input it already holds (the input is the first
/// tensor the block saves). `sqrt` keeps the input of each of its ⌈√n⌉ segments and
/// recomputes one segment at a time. Selective recomputation drops the core-attention terms of
/// every block and recomputes them one block at a time.
pub fn model_activations(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
    policy: Checkpoint,
    loss: Loss,
) -> f64 {
    let w: Width = w.into();
    held_at_backward_start(spec, s, b, w, attention, policy, loss)
        + recomputed(spec, s, b, w, attention, policy, loss)
}

/// Activation bytes held when backward starts, at the loss's node: what each block keeps under
/// the policy and the terms outside the blocks; no block has been re-run yet.
pub fn held_at_backward_start(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
    policy: Checkpoint,
    loss: Loss,
) -> f64 {
    let w: Width = w.into();
    let blk = block(spec, s, b, w, attention);
    let n = spec.total_blocks();
    let outside = outside_blocks(spec, s, b, w, loss);
    let policy = effective_policy(spec, s, b, w, attention, policy, loss);
    let blocks = match policy {
        Checkpoint::None => n as f64 * (blk.full() + kv_cache_copies(spec, s, b, w.e, attention)),
        Checkpoint::Selective => n as f64 * blk.linear_part,
        Checkpoint::SelectiveOp => {
            n as f64 * op_selective(spec, s, b, w, attention).kept.min(blk.full())
        }
        Checkpoint::EveryNth(_) => {
            let c = checkpointed_blocks(policy, n) as f64;
            c * blk.input
                + (n as f64 - c) * blk.full()
                + checkpointed_mask(spec, s, b, w, attention)
        }
        Checkpoint::Sqrt if n > 0 => {
            let len = n.div_ceil((n as f64).sqrt().ceil() as u64);
            n.div_ceil(len) as f64 * blk.input + checkpointed_mask(spec, s, b, w, attention)
        }
        Checkpoint::Sqrt => 0.0,
        Checkpoint::Budget(_) => unreachable!("effective_policy resolves a budget"),
    };
    blocks + outside
}

/// Activation bytes backward re-creates one block (or `sqrt` segment) at a time, beyond what
/// the policy keeps: a checkpointed block's activations less its kept input, a segment's less
/// its input, the dropped core attention of one block, what selective op recomputation drops
/// from one block; nothing without recomputation.
pub fn recomputed(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
    policy: Checkpoint,
    loss: Loss,
) -> f64 {
    let w: Width = w.into();
    let blk = block(spec, s, b, w, attention);
    let n = spec.total_blocks();
    match effective_policy(spec, s, b, w, attention, policy, loss) {
        Checkpoint::None => 0.0,
        Checkpoint::Selective => blk.core_attention,
        Checkpoint::SelectiveOp => {
            blk.full() - op_selective(spec, s, b, w, attention).kept.min(blk.full())
        }
        Checkpoint::EveryNth(_) => blk.full() - blk.input,
        Checkpoint::Sqrt if n > 0 => {
            let len = n.div_ceil((n as f64).sqrt().ceil() as u64);
            len as f64 * blk.full() - blk.input
        }
        Checkpoint::Sqrt => 0.0,
        Checkpoint::Budget(_) => unreachable!("effective_policy resolves a budget"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::load_model;

    #[test]
    fn gpt_block_reproduces_korthikanti_eq1() {
        // GPT-2 style (MHA, f = 4h, GeLU, dropout), 16-bit: sbh·(34 + 5as/h). Megatron's GeLU
        // is one kernel, not transformers' Python `gelu_new`.
        let m = Architecture {
            python_gelu: false,
            ..load_model("gpt2-xl").unwrap()
        };
        let (s, b) = (1024.0, 4.0);
        let (h, a) = (1600.0, 25.0);
        let blk = block(&m, s, b, 2.0, Attention::Naive);
        let expected = s * b * h * (34.0 + 5.0 * a * s / h);
        assert!(
            (blk.full() - expected).abs() < 1e-6,
            "{} vs {expected}",
            blk.full()
        );
        // Selective recompute keeps the 34·sbh part (Table 2, "selective recompute", t = 1).
        assert!((blk.linear_part - 34.0 * s * b * h).abs() < 1e-6);
        // Full recompute keeps sbh·2 (Table 2, last row).
        assert_eq!(blk.input, 2.0 * s * b * h);
    }

    #[test]
    fn gpt_neox_eager_attention_saves_fp32_probabilities_and_their_cast() {
        // transformers' GPT-NeoX `eager_attention_forward` runs
        // `softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)`: the softmax saves its
        // fp32 output (4 bytes per score) and the second matmul the fp16 cast (2 bytes), so
        // pure fp16 keeps 6·a·s²·b per block in the core-attention term; GPT-2's softmax stays
        // in the scores' dtype (2 bytes).
        let (s, b) = (1024.0, 2.0);
        let neox = crate::model::Family::GptNeox;
        let m = Architecture {
            num_heads: 16,
            num_kv_heads: 16,
            head_dim: 64,
            ..Architecture::dense("pythia-410m", neox, 50304, 1024, 24, 4096)
        };
        let a = 16.0;
        let blk = block(&m, s, b, 2.0, Attention::Naive);
        assert_eq!(blk.core_attention, 6.0 * a * s * s * b);
        let gpt2 = Architecture {
            dropout: false,
            ..load_model("gpt2").unwrap()
        };
        let a2 = gpt2.num_heads as f64;
        let blk2 = block(&gpt2, s, b, 2.0, Attention::Naive);
        assert_eq!(blk2.core_attention, 2.0 * a2 * s * s * b);
    }

    #[test]
    fn residual_mlp_block_keeps_one_norm_input_and_the_mlp_terms() {
        // headroom's residual MLP: per block the norm input x, the fc1 input LN(x), the fc1
        // output and the GELU output, e·sb·(2h + 2f); outside the blocks the final-norm and
        // head inputs 2·e·sbh and the fp32 logits 4·sbv. No attention terms.
        let spec = Architecture::dense("resmlp", crate::model::Family::ResMlp, 256, 128, 16, 512);
        let (s, b, e) = (32.0, 8.0, 4.0);
        let blk = block(&spec, s, b, e, Attention::Naive);
        assert_eq!(blk.full(), e * s * b * (2.0 * 128.0 + 2.0 * 512.0));
        assert_eq!(blk.core_attention, 0.0);
        let all = model_activations(
            &spec,
            s,
            b,
            e,
            Attention::Naive,
            Checkpoint::None,
            Loss::Plain,
        );
        assert_eq!(
            all,
            16.0 * blk.full() + 2.0 * e * s * b * 128.0 + 4.0 * s * b * 256.0
        );
    }

    #[test]
    fn swiglu_gqa_block_matches_hand_count() {
        // llama-3-8b, s = 4096, b = 1, bf16, no dropout, naive (eager) attention:
        //   norms 2·(2 + 4)·sbh: each RMSNorm's bf16 input replaced by its fp32 copy (4) plus
        //   the bf16 normalised tensor (2), against the 2 of a LayerNorm's input;
        //   attention linear 2·sb·(4096 + 4096 + 4096 + 4096 + 4096): eager saves repeat_kv's
        //   copies of K and V at the query width 4096, not the 1024 of the kv heads;
        //   core (4 + 2)·a·s²: the fp32 softmax output and its bf16 cast;
        //   MLP 2·sbh + 4·2·sb·14336.
        let m = load_model("llama-3-8b").unwrap();
        let (s, h, f, a) = (4096.0, 4096.0, 14336.0, 32.0);
        let expected =
            12.0 * s * h + 2.0 * s * 20480.0 + 6.0 * a * s * s + 2.0 * s * h + 8.0 * s * f;
        let blk = block(&m, s, 1.0, 2.0, Attention::Naive);
        assert!((blk.full() - expected).abs() < 1e-3);
        // SDPA without a mask keeps K and V at the kv width and only a log-sum-exp: 4·a·s.
        let expected = 12.0 * s * h + 2.0 * s * 14336.0 + 4.0 * a * s + 2.0 * s * h + 8.0 * s * f;
        let blk = block(&m, s, 1.0, 2.0, Attention::MemoryEfficient);
        assert!((blk.full() - expected).abs() < 1e-3);
    }

    #[test]
    fn gemmas_rmsnorm_keeps_its_fp32_copy_and_fp32_normalised_tensor() {
        // GemmaRMSNorm: x.float() (a 4-byte copy of a bf16 input, the input itself in fp32)
        // and x·rsqrt(…) kept in fp32 for the weight's (1 + w) product: against a LayerNorm's
        // input at the residual width r, 4 − r + 4 bytes per element, two norms per block.
        let text = r#"{"model_type": "gemma", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 128,
            "num_hidden_layers": 1, "vocab_size": 100}"#;
        let gemma = crate::model::parse_config("g", text).unwrap();
        let fused = Architecture {
            transformers_modules: false,
            ..gemma.clone()
        };
        let (s, b, sbh) = (32.0, 2.0, 32.0 * 2.0 * 64.0);
        for (e, per_norm) in [(2.0, 6.0), (4.0, 4.0)] {
            let extra = block(&gemma, s, b, e, Attention::MemoryEfficient).full()
                - block(&fused, s, b, e, Attention::MemoryEfficient).full();
            assert_eq!(extra, 2.0 * per_norm * sbh, "e = {e}");
        }
    }

    #[test]
    fn sqrt_keeps_segment_inputs_and_one_segment() {
        // The residual MLP at s = 32, b = 8, fp32: per block e·sb·(2h + 2f) = 4·256·1280, its
        // input e·sbh = 4·256·128. 16 blocks: ⌈√16⌉ = 4 segments of 4 blocks; backward holds
        // the 4 segment inputs and one segment re-run, less the input it already holds.
        let spec = Architecture::dense("resmlp", crate::model::Family::ResMlp, 256, 128, 16, 512);
        let (s, b, e) = (32.0, 8.0, 4.0);
        let full = e * s * b * (2.0 * 128.0 + 2.0 * 512.0);
        let input = e * s * b * 128.0;
        let outside = outside_blocks(&spec, s, b, e, Loss::Plain);
        let sqrt = model_activations(
            &spec,
            s,
            b,
            e,
            Attention::Naive,
            Checkpoint::Sqrt,
            Loss::Plain,
        );
        assert_eq!(sqrt, 4.0 * input + 4.0 * full - input + outside);
        assert_eq!(checkpointed_blocks(Checkpoint::Sqrt, 16), 16);
    }

    #[test]
    fn a_budget_buys_the_least_recomputation_that_fits_it() {
        let spec = Architecture::dense("resmlp", crate::model::Family::ResMlp, 256, 128, 16, 512);
        let (s, b, e) = (32.0, 8.0, 4.0);
        let act = |c| model_activations(&spec, s, b, e, Attention::Naive, c, Loss::Plain);
        let resolve = |budget: f64| {
            effective_policy(
                &spec,
                s,
                b,
                e,
                Attention::Naive,
                Checkpoint::Budget(budget as u64),
                Loss::Plain,
            )
        };
        // Enough for everything: nothing recomputed.
        assert_eq!(resolve(act(Checkpoint::None)), Checkpoint::None);
        // Exactly every:2's activations: every:K for K > 2 recomputes less but needs more, so
        // every:2 is the answer (every:3 keeps 10 of 16 blocks whole, every:2 only 8).
        assert!(act(Checkpoint::EveryNth(3)) > act(Checkpoint::EveryNth(2)));
        assert_eq!(
            resolve(act(Checkpoint::EveryNth(2))),
            Checkpoint::EveryNth(2)
        );
        // Too little for anything: every block, the least memory this family has.
        assert_eq!(resolve(0.0), Checkpoint::ALL_BLOCKS);
        // The budget policy is charged what its resolution is charged.
        let budget = Checkpoint::Budget(act(Checkpoint::EveryNth(2)) as u64);
        assert_eq!(act(budget), act(Checkpoint::EveryNth(2)));
    }
}
