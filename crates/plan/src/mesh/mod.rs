//! Memory per rank and per pipeline stage of a transformer trained on a device mesh: tensor
//! parallelism with or without sequence parallelism, pipeline parallelism under 1F1B or the
//! interleaved schedule, and the ZeRO stage across the data-parallel replicas (Megatron-LM's
//! distributed optimizer is ZeRO-1).
//!
//! - `activation`: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
//!   Transformer Models", arXiv:2205.05198), Table 2, per layer, with and without SP, with
//!   selective or full recompute.
//! - `schedule`: how many micro-batches each stage holds at its peak, by replaying the schedule
//!   Megatron-LM runs (Narayanan et al. 2021, arXiv:2104.04473; NVIDIA/Megatron-LM
//!   `megatron/core/pipeline_parallel/schedules.py`).
//! - `candidates`: every tp × pp × dp mesh a model, batch and cluster admit.
//! - `from_model`: the inputs taken from a loaded model.
//! - `rank`: model states and activations of every stage's ranks, and the most loaded one.
//!
//! - `time`: TP collectives, pipeline sends and the bubble.
//! - `plan`: one mesh costed on the planner's hardware (memory per stage with working buffers
//!   and reserve, step time with the planner's compute model).
//! - `search`: every mesh × the levers a mesh run keeps, ranked; pins and their constraints.
//! - `choice`: the meshes beside the best plain data-parallel plan, and why each rejected axis
//!   value lost.
//!
//! Not for: single-device plans (the `cost` module).

mod activation;
mod candidates;
mod choice;
mod from_model;
mod plan;
mod rank;
mod schedule;
mod search;
mod time;

pub use activation::{Recompute, layer_activation_bytes};
pub use candidates::candidate_meshes;
pub use choice::{AxisVerdict, Layout, LayoutSummary, MeshChoice, choose};
pub use from_model::mesh_shape;
pub use plan::{
    MeshPlan, StagePeak, context_attention_bytes, evaluate_mesh, expert_dispatch_bytes,
};
pub use rank::{
    MeshFramework, MeshMemory, StageMemory, bytes_per_parameter, context_shard, mesh_memory,
};
pub use schedule::peak_in_flight;
pub use search::{MeshPins, MeshSearch, rank_meshes, search_meshes, unreachable_values};
pub use time::{
    LinkBandwidths, bubble_fraction, cp_bytes_per_layer, ep_bytes_per_layer,
    pp_bytes_per_microbatch, step_seconds, tp_bytes_per_layer,
};

/// The dimensions of a decoder-only transformer that the mesh memory model needs, in
/// Korthikanti et al.'s notation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshModel {
    /// s: tokens per sequence.
    pub seq: u64,
    /// b: sequences per micro-batch.
    pub micro_batch: u64,
    /// h: hidden width.
    pub hidden: u64,
    /// a: attention heads.
    pub heads: u64,
    /// Key/value heads (grouped-query attention; `heads` for multi-head attention).
    pub kv_heads: u64,
    /// L: transformer layers.
    pub layers: u64,
    /// V: vocabulary, padded as the run pads it.
    pub vocab: u64,
    /// The MLP's intermediate width (4h for GPT).
    pub ffn: u64,
    /// A gated MLP (SwiGLU: three matrices) instead of two.
    pub gated: bool,
    /// Parameters per hidden unit of each norm: 2 for LayerNorm (weight and bias), 1 for RMSNorm.
    pub norm_params: u64,
    /// The output layer shares the input embedding's weights.
    pub tied_embeddings: bool,
    /// A mixture of experts in every layer's MLP (`None`: one dense MLP of width `ffn`).
    pub moe: Option<MoeShape>,
}

/// The experts of a mixture-of-experts layer: `experts` routed MLPs of width `ffn` each, of
/// which each token takes `per_token`, and optionally one shared MLP every token passes
/// through (Qwen2-MoE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    pub experts: u64,
    pub per_token: u64,
    /// The shared expert's width; 0 when there is none.
    pub shared_ffn: u64,
}

impl MeshModel {
    /// Weight-matrix parameters of one layer, all split across the tensor-parallel ranks:
    /// Q and the output projection h² each, K and V h²·kv/a each, the MLP (2 or 3)·h·ffn.
    /// Linear biases are left out, as Megatron-LM's Llama and GPT-3 configurations run without
    /// them (`--disable-bias-linear`) and its estimator counts none.
    pub fn layer_matrix_parameters(&self) -> u64 {
        self.layer_dense_matrix_parameters() + self.layer_expert_parameters()
    }

    /// The weight matrices of one layer outside its routed experts (split across the tp ranks
    /// only): attention, and the dense MLP or the shared expert.
    pub fn layer_dense_matrix_parameters(&self) -> u64 {
        let attention = 2 * self.hidden * self.hidden
            + 2 * self.hidden * self.hidden * self.kv_heads / self.heads;
        let mlp = match self.moe {
            None => self.mlp_matrices(self.ffn),
            Some(moe) => self.mlp_matrices(moe.shared_ffn),
        };
        attention + mlp
    }

    /// The routed experts' matrices of one layer, E MLPs of width `ffn` (split across the ep
    /// ranks, each holding E/ep experts, and the tp ranks); 0 for a dense model.
    pub fn layer_expert_parameters(&self) -> u64 {
        self.moe
            .map_or(0, |moe| moe.experts * self.mlp_matrices(self.ffn))
    }

    fn mlp_matrices(&self, width: u64) -> u64 {
        let matrices = if self.gated { 3 } else { 2 };
        matrices * self.hidden * width
    }

    /// Parameters of one layer replicated on every tensor-parallel rank: its two norms and,
    /// in a mixture of experts, the router (E·h) and the shared expert's one-output gate (h).
    pub fn layer_norm_parameters(&self) -> u64 {
        let router = self.moe.map_or(0, |moe| {
            (moe.experts + u64::from(moe.shared_ffn > 0)) * self.hidden
        });
        2 * self.norm_params * self.hidden + router
    }

    /// The word embedding (and an untied output layer): V·h.
    pub fn embedding_parameters(&self) -> u64 {
        self.vocab * self.hidden
    }
}
