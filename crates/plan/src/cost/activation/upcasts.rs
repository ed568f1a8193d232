//! Bytes per element a model family's norms and naive attention's softmax save beyond the
//! compute width: the fp32 upcasts of transformers' modules.
//!
//! Not for: which tensors a block saves (`block`), the widths a strategy saves at (`Width`).

use super::Width;
use crate::model::{Architecture, Family};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::activation::block;
    use crate::model::load_model;
    use crate::strategy::Attention;

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
}
