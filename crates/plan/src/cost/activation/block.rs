//! The activations one transformer block saves for backward: the per-block formula of the table
//! in `activation`'s header (Korthikanti et al. Eq. 1, generalised).
//!
//! Not for: the fp32 copies norms and softmax save (`upcasts`), what a checkpoint policy keeps of
//! a block (`checkpointing`).

use super::Width;
use super::upcasts::{norm_upcast, saved_probabilities};
use crate::model::lora::LoraSaves;
use crate::model::{Architecture, Family, MlpKind};
use crate::strategy::Attention;

/// The widths of a block, as floats: hidden `h`, query `q`, key/value `kv`, FFN `f`.
pub(in crate::cost) fn dims(spec: &Architecture) -> (f64, f64, f64, f64) {
    (
        spec.hidden_size as f64,
        spec.q_dim() as f64,
        spec.kv_dim() as f64,
        spec.intermediate_size as f64,
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::activation::model_activations;
    use crate::model::load_model;
    use crate::strategy::{Checkpoint, Loss};

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
}
