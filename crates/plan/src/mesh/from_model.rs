//! The mesh memory model's inputs taken from a model the planner has loaded (a preset or a
//! Hugging Face `config.json`): `MeshModel` from an `Architecture` with the sequence and
//! micro-batch, and the `MeshShape` a `Mesh` is validated against.
//!
//! Not for: loading models (`model`) or costing the mesh (`rank`).

use super::{MeshModel, MoeShape};
use crate::PlanError;
use crate::model::{Architecture, Family, MlpKind};
use headroom_strategy::MeshShape;

impl MeshModel {
    /// The decoder-only dense transformer `arch` at `seq` tokens per sequence and `micro_batch`
    /// sequences per micro-batch (a mixture of experts with its experts, `MoeShape`). Refused:
    /// encoders and encoder-decoders, and attention whose query width heads·head_dim differs
    /// from the hidden width (Korthikanti et al.'s terms assume equality).
    pub fn from_architecture(
        arch: &Architecture,
        seq: u64,
        micro_batch: u64,
    ) -> Result<MeshModel, PlanError> {
        let refuse = |why: String| {
            Err(PlanError::Incompatible(format!(
                "the mesh memory model cannot take {}: {why}",
                arch.name
            )))
        };
        let norm_params = match arch.family {
            Family::Llama
            | Family::Mistral
            | Family::Qwen2
            | Family::Gemma
            | Family::Gemma2
            | Family::Phi3
            | Family::Mixtral
            | Family::Qwen2Moe => 1,
            Family::Gpt2 | Family::GptNeox => 2,
            Family::Bert | Family::T5 | Family::ResMlp => {
                return refuse("tensor and pipeline parallelism are modelled for decoder-only transformers only".into());
            }
        };
        if arch.num_heads * arch.head_dim != arch.hidden_size {
            return refuse(format!(
                "its query width {}·{} differs from its hidden width {}",
                arch.num_heads, arch.head_dim, arch.hidden_size
            ));
        }
        Ok(MeshModel {
            seq,
            micro_batch,
            hidden: arch.hidden_size,
            heads: arch.num_heads,
            kv_heads: arch.num_kv_heads,
            layers: arch.num_layers,
            vocab: arch.vocab_size,
            ffn: arch.intermediate_size,
            gated: arch.mlp == MlpKind::Gated,
            norm_params,
            tied_embeddings: arch.tie_word_embeddings,
            moe: (arch.num_experts > 1).then_some(MoeShape {
                experts: arch.num_experts,
                per_token: arch.experts_per_token,
                shared_ffn: arch.shared_expert_size,
            }),
        })
    }
}

/// What a mesh must divide for `arch`, a global batch of `global_batch` sequences in
/// micro-batches of `micro_batch`, and `gpus_per_node` GPUs per node.
pub fn mesh_shape(
    arch: &Architecture,
    global_batch: u64,
    micro_batch: u64,
    gpus_per_node: u64,
) -> MeshShape {
    MeshShape {
        attention_heads: arch.num_heads,
        kv_heads: arch.num_kv_heads,
        layers: arch.num_layers,
        // Dense models count their one MLP as one expert.
        experts: if arch.num_experts > 1 {
            arch.num_experts
        } else {
            0
        },
        global_batch,
        micro_batch,
        gpus_per_node,
    }
}
