//! torchtitan's per-operator selective activation checkpointing (`--checkpoint selective-op`):
//! what a block keeps and what its backward recomputes.
//!
//! Not for: the other policies (see `activation`).

use super::activation::dims;
use super::width::Width;
use crate::model::{Architecture, Family, MlpKind};
use crate::strategy::Attention;

/// What torchtitan's per-operator selective checkpointing (`selective-op`) keeps of one block
/// for micro-batch `b`, and the matmul weights its recomputation runs again per token.
///
/// Its policy saves the outputs of `aten.mm` except every second one counted within the
/// block (so the 1st, 3rd, 5th … in execution order), and of the SDPA kernels; everything else
/// (norms, activations, element-wise products, naive attention's batched matmuls and softmax)
/// is recomputed from the block's input, which the checkpoint keeps. Matmuls run in the order
/// q, k, v (one fused qkv where the model fuses them), o, then gate, up, down (fused gate_up
/// for Phi-3) or fc, proj.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpSelective {
    /// Bytes one block keeps: its input, the saved matmul outputs, the attention kernel's
    /// output and log-sum-exp (memory-efficient attention only).
    pub kept: f64,
    /// Matmul weights recomputed per token (2 FLOPs each), experts scaled by k.
    pub recomputed_weights: f64,
    /// Whether the core attention is recomputed (naive attention is not an SDPA kernel).
    pub recomputes_attention: bool,
}

/// [`OpSelective`] of `spec`'s blocks (see there).
pub fn op_selective(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
) -> OpSelective {
    let w: Width = w.into();
    let (h, q, kv, f) = dims(spec);
    let k = spec.experts_per_token as f64;
    let sb = s * b;
    // (output width, weights) of each matmul in execution order.
    let mut mms: Vec<(f64, f64)> = Vec::new();
    if spec.has_attention() {
        match matches!(spec.family, Family::Gpt2 | Family::GptNeox | Family::Phi3) {
            true => mms.push((q + 2.0 * kv, h * (q + 2.0 * kv))),
            false => mms.extend([(q, h * q), (kv, h * kv), (kv, h * kv)]),
        }
        mms.push((h, q * h));
    }
    let attention_matmuls = mms.len();
    match (spec.mlp, spec.family) {
        (MlpKind::Gated, Family::Phi3) => mms.extend([(2.0 * f, 2.0 * h * f), (h, f * h)]),
        (MlpKind::Gated, _) => mms.extend([(f, h * f), (f, h * f), (h, f * h)]),
        (MlpKind::Plain, _) => mms.extend([(f, h * f), (h, f * h)]),
    }
    let routed_matmuls = mms.len();
    let shared = spec.shared_expert_size as f64;
    if shared > 0.0 {
        mms.extend([(shared, h * shared), (shared, h * shared), (h, shared * h)]);
    }
    let mut kept = w.residual * sb * h;
    let mut recomputed = 0.0;
    for (i, &(width, weights)) in mms.iter().enumerate() {
        // Routed MLP matmuls run once per expert a token is routed to.
        let times = if (attention_matmuls..routed_matmuls).contains(&i) {
            k
        } else {
            1.0
        };
        match i % 2 == 0 {
            true => kept += times * w.e * sb * width,
            false => recomputed += times * weights,
        }
    }
    let sdpa = spec.has_attention() && attention == Attention::MemoryEfficient;
    if sdpa {
        kept += w.e * sb * q + 4.0 * spec.num_heads as f64 * s * b;
    }
    OpSelective {
        kept,
        recomputed_weights: recomputed,
        recomputes_attention: spec.has_attention() && !sdpa,
    }
}
