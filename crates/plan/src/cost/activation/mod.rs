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
//! The 34·sbh + 5·as²b of Eq. 1 is reproduced exactly for GPT-style blocks (see `block`'s tests).
//! T5 decoder blocks add a cross-attention costed like a self-attention plus a third norm. A
//! block without attention (headroom's residual MLP) keeps one norm input and the MLP terms.
//!
//! The module is laid out by concept: `block` (the per-block formula of the table), `upcasts`
//! (the fp32 copies norms and naive attention's softmax save), `outside` (the terms outside the
//! blocks and the loss's vocabulary-sized tensors), `checkpointing` (what each policy keeps and
//! what backward recomputes).
//!
//! Not for: parameters, gradients or optimizer states (see `memory`).

mod block;
mod checkpointing;
mod outside;
mod upcasts;

pub use super::selective_op::{OpSelective, op_selective};
pub use super::width::Width;
pub(super) use block::dims;
pub use block::{BlockActivations, block};
pub use checkpointing::{
    checkpointed_blocks, checkpointed_inputs, checkpointed_mask, effective_policy,
    held_at_backward_start, kv_cache_copies, model_activations, recomputed,
};
pub use outside::{
    kept_logits, logits, logits_grad, outside_blocks, previous_outputs, upcast_logits,
};
