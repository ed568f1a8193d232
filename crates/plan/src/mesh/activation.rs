//! Activation bytes one transformer layer keeps for its backward on one tensor-parallel rank:
//! Korthikanti et al. 2022 (arXiv:2205.05198), §4 and Table 2, with 16-bit activations and
//! 1-byte dropout masks, generalised from the GPT MLP (4h) to any intermediate width f.
//!
//! Per layer (s sequence, b micro-batch, h hidden, a heads, t tensor-parallel ranks):
//! - replicated on every rank without SP: the two LayerNorm inputs (4sbh), the QKV and MLP
//!   inputs (2sbh each) and the two dropout masks (sbh each): 10sbh;
//! - split by t: Q and K (4sbh), V and the attention output projection's input (4sbh), the MLP's
//!   activation input and second linear's input (2sbf each = 4sbf; 16sbh for f = 4h), and the
//!   attention core's scores, softmax output and softmax-dropout mask (5as²b); a gated (SwiGLU)
//!   MLP keeps its first linear's output of width 2f and the second linear's input of width f
//!   (Megatron-LM's fused SwiGLU recomputes the SiLU from the former): 6sbf instead of 4sbf;
//! - with sequence parallelism the replicated 10sbh is split along the sequence too, so the
//!   whole layer is divided by t;
//! - a mixture of experts (each token routed to k of E experts of width f) keeps the MLP term
//!   for each of a token's k experts (k·6sbf/t) and its shared expert's (6sbf_s/t), the k
//!   routed copies of each token its experts read (k·2sbh, replicated like the MLP input:
//!   /t under SP) and the router's fp32 logits and probabilities (8sbE, /t under SP); tokens
//!   are taken as evenly routed, so an expert-parallel rank computes k·s·b token-expert pairs;
//! - selective recompute recomputes the attention core and drops the 5as²b term;
//! - full recompute keeps only the layer's input, 2sbh (sequence-split under SP: 2sbh/t).
//!
//! Not for: which layers a stage holds or for how many micro-batches (`schedule`, `rank`).

use super::MeshModel;

/// Which activations a layer recomputes in its backward instead of keeping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Recompute {
    /// Keep every activation.
    #[default]
    None,
    /// Recompute the attention core (Korthikanti et al. §5).
    Selective,
    /// Keep only each layer's input and recompute the whole layer.
    Full,
}

/// Bytes one layer keeps per micro-batch on one tensor-parallel rank.
pub fn layer_activation_bytes(
    model: &MeshModel,
    tp: u64,
    sequence_parallel: bool,
    recompute: Recompute,
) -> f64 {
    let (s, b, h, a, f) = (
        model.seq as f64,
        model.micro_batch as f64,
        model.hidden as f64,
        model.heads as f64,
        model.ffn as f64,
    );
    let t = tp as f64;
    let sbh = s * b * h;
    let sp = if sequence_parallel { t } else { 1.0 };
    if recompute == Recompute::Full {
        return 2.0 * sbh / sp;
    }
    let per_width = if model.gated { 6.0 } else { 4.0 } * s * b;
    let (mlp, routing) = match model.moe {
        None => (per_width * f, 0.0),
        Some(moe) => {
            let k = moe.per_token as f64;
            (
                k * per_width * f + per_width * moe.shared_ffn as f64,
                (k * 2.0 * sbh + 8.0 * s * b * moe.experts as f64) / sp,
            )
        }
    };
    let replicated = 10.0 * sbh / sp + routing;
    let split = (8.0 * sbh + mlp) / t;
    let core = match recompute {
        Recompute::None => 5.0 * a * s * s * b / t,
        _ => 0.0,
    };
    replicated + split + core
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPT-shaped layer (f = 4h) with numbers small enough to check by hand:
    /// s = 8, b = 2, h = 16, a = 4, so sbh = 256 and as²b = 512.
    fn gpt() -> MeshModel {
        MeshModel {
            seq: 8,
            micro_batch: 2,
            hidden: 16,
            heads: 4,
            kv_heads: 4,
            layers: 4,
            vocab: 64,
            ffn: 64,
            gated: false,
            norm_params: 2,
            tied_embeddings: true,
            moe: None,
        }
    }

    #[test]
    fn table_2_of_korthikanti() {
        let m = gpt();
        // No parallelism: sbh(34 + 5as/h) = 256·34 + 5·512 = 8704 + 2560.
        assert_eq!(
            layer_activation_bytes(&m, 1, false, Recompute::None),
            11264.0
        );
        // TP 4: sbh(10 + 24/4) + 5as²b/4 = 256·16 + 640.
        assert_eq!(
            layer_activation_bytes(&m, 4, false, Recompute::None),
            4736.0
        );
        // TP 4 + SP: everything / 4 = 11264 / 4.
        assert_eq!(layer_activation_bytes(&m, 4, true, Recompute::None), 2816.0);
        // TP 4 + selective: sbh(10 + 6) = 4096.
        assert_eq!(
            layer_activation_bytes(&m, 4, false, Recompute::Selective),
            4096.0
        );
        // TP 4 + SP + selective: 34sbh/4 = 2176.
        assert_eq!(
            layer_activation_bytes(&m, 4, true, Recompute::Selective),
            2176.0
        );
        // Full: the input 2sbh = 512, split by SP to 128.
        assert_eq!(layer_activation_bytes(&m, 4, false, Recompute::Full), 512.0);
        assert_eq!(layer_activation_bytes(&m, 4, true, Recompute::Full), 128.0);
    }

    #[test]
    fn a_mixture_of_experts_keeps_each_tokens_k_experts_its_copies_and_the_router() {
        // 4 experts of width 64, 2 per token: the MLP term twice (k·4sbf = 8192 for 4096),
        // the two routed copies of each token 2·2sbh = 1024 and the router's fp32 logits and
        // probabilities 8sbE = 8·8·2·4 = 512: 11264 − 4096 + 8192 + 1024 + 512.
        let moe = MeshModel {
            moe: Some(super::super::MoeShape {
                experts: 4,
                per_token: 2,
                shared_ffn: 0,
            }),
            ..gpt()
        };
        assert_eq!(
            layer_activation_bytes(&moe, 1, false, Recompute::None),
            16896.0
        );
        // TP 4 + SP: everything / 4; full recompute keeps the layer input only.
        assert_eq!(
            layer_activation_bytes(&moe, 4, true, Recompute::None),
            16896.0 / 4.0
        );
        assert_eq!(
            layer_activation_bytes(&moe, 4, true, Recompute::Full),
            128.0
        );
    }

    #[test]
    fn the_mlp_term_follows_the_intermediate_width() {
        // f = 2h instead of 4h: 4sbf = 8sbh instead of 16sbh, so sbh(26 + 5as/h) unsplit.
        let m = MeshModel { ffn: 32, ..gpt() };
        assert_eq!(
            layer_activation_bytes(&m, 1, false, Recompute::None),
            256.0 * 26.0 + 2560.0
        );
        // Gated with f = 32: 6sbf = 6·8·2·32 = 3072 in place of 4sbf = 2048.
        let swiglu = MeshModel { gated: true, ..m };
        assert_eq!(
            layer_activation_bytes(&swiglu, 1, false, Recompute::None),
            256.0 * 26.0 + 2560.0 + 1024.0
        );
    }
}
