//! Memory of every pipeline stage's ranks on a mesh, and the most loaded one.
//!
//! Model states: stage i holds L/p layers (in v chunks; with `fewer_layers_at_ends` k, the first
//! and last chunk k fewer, the others (L + 2k)/(p·v)); their weight matrices are split across
//! the tp ranks and their norms replicated. Stage 0 also holds the vocabulary-parallel word
//! embedding (V·h/t); the last stage the final norm and the output layer (V·h/t; with tied
//! embeddings and p > 1 Megatron-LM keeps a copy there and all-reduces its gradient). Bytes per
//! parameter for mixed-precision Adam with fp32 gradients, in the framework's layout
//! ([`MeshFramework`]). Megatron-LM: 2 (bf16 weight) + 4 (fp32 gradient) + 12 (fp32 master
//! weight, Adam's two moments), with the ZeRO stage across the dp replicas: 18 at stage 0;
//! 6 + 12/dp at stage 1 (Megatron-LM's distributed optimizer); 2 + 16/dp at stage 2; 18/dp at
//! stage 3. torchtitan (FSDP2 with `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`):
//! the fp32 parameters are the master copy, so 4 (fp32 parameter) + 4 (fp32 gradient) + 8 (Adam)
//! = 16, sharded as the stage says: 16 at stage 0 (DDP), 8 + 8/dp at 1, 4 + 12/dp at 2, 16/dp
//! at 3 (FSDP). The 16-bit copies FSDP gathers are working buffers (`plan`).
//!
//! Activations: the in-flight chunk-micro-batches of `schedule` (at the moment their bytes are
//! largest) × the layers of their chunk × the per-layer bytes of `activation`; on stage 0, per in-flight micro-batch of its first chunk, the
//! token ids (8sb, int64, the same on every tp rank) and the embedding's dropout mask (sbh bytes,
//! sequence-split under SP); on the last stage, per in-flight micro-batch of its last chunk, the
//! output layer and loss: 4sbh/t(1 + V/h) (Korthikanti et al. 2022, §4.3: the final norm's and
//! output layer's inputs, split by t under SP, and the fp32 logits of the vocabulary-parallel
//! cross-entropy; without SP the 4sbh part is not split).
//!
//! Expert parallelism (ep ranks, taken from the dp·cp ranks as Megatron-LM and torchtitan take
//! them): each rank holds E/ep of every layer's routed experts (split across tp too), and the
//! experts' states are sharded across the dp·cp/ep ranks that hold the same experts.
//!
//! Context parallelism (cp ranks): each rank holds s/cp of every sequence (PyTorch's context
//! parallelism shards the sequence dimension of every activation), so every term above takes
//! s/cp, except the attention core kept without recompute, whose local queries meet the whole
//! sequence's keys (5a·(s/cp)·s·b/t); the model states are sharded across dp·cp, the ranks that
//! hold the same weights (torchtitan's FSDP mesh `dp_shard_cp`, Megatron-LM's data-parallel
//! group with context parallelism).
//!
//! Not for: activation offload, communication buffers (`plan`).

use super::{MeshModel, Recompute, layer_activation_bytes, peak_in_flight};
use headroom_strategy::{Framework, Mesh, ZeroStage};

/// Whose layout of model states and gathering a mesh run follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MeshFramework {
    /// Megatron-LM: bf16 weights beside an fp32 master copy; ZeRO-1 is its distributed optimizer.
    Megatron,
    /// torchtitan: FSDP2 over fp32 parameters gathered in bf16, DDP at ZeRO-0.
    Torchtitan,
}

impl MeshFramework {
    /// The mesh layout of a planner framework: `fsdp` (PyTorch's stack) is torchtitan's, the
    /// default `deepspeed` (a 16-bit model beside fp32 master weights) Megatron-LM's.
    pub fn of(framework: Framework) -> MeshFramework {
        match framework {
            Framework::Fsdp => MeshFramework::Torchtitan,
            Framework::DeepSpeed => MeshFramework::Megatron,
        }
    }
}

/// The memory of one rank of one pipeline stage (every tp rank of a stage holds the same).
#[derive(Clone, Debug, PartialEq)]
pub struct StageMemory {
    pub stage: u64,
    /// Transformer layers on this stage (all its chunks).
    pub layers: u64,
    /// Chunk-micro-batches whose activations the stage holds at its peak.
    pub in_flight: u64,
    /// Parameters on one rank of this stage.
    pub parameters: f64,
    /// Of which routed experts' (sharded across dp·cp/ep replicas, not dp·cp).
    pub expert_parameters: f64,
    /// Weights, gradients and optimizer states, bytes.
    pub model_states: f64,
    /// Activations kept for the backward at the stage's peak, bytes.
    pub activations: f64,
}

impl StageMemory {
    pub fn total(&self) -> f64 {
        self.model_states + self.activations
    }
}

/// Every stage's memory and the most loaded one.
#[derive(Clone, Debug, PartialEq)]
pub struct MeshMemory {
    pub stages: Vec<StageMemory>,
    /// Index into `stages` of the most loaded stage (the first of equals).
    pub peak_stage: u64,
    /// The global rank of the first tp rank of the peak stage, in Megatron-LM's rank order
    /// (tp fastest, then cp, then dp, then pp).
    pub peak_rank: u64,
}

impl MeshMemory {
    pub fn peak(&self) -> &StageMemory {
        &self.stages[self.peak_stage as usize]
    }

    /// "pipeline stage 0 (ranks 0–7, the tp group of its first replica)".
    pub fn describe_peak(&self, mesh: &Mesh) -> String {
        let last = self.peak_rank + mesh.tp - 1;
        format!(
            "pipeline stage {} of {} (ranks {}–{last}, the tp group of its first replica)",
            self.peak_stage, mesh.pp, self.peak_rank
        )
    }
}

/// The part of `model` one context-parallel rank holds: s/cp of each sequence.
pub fn context_shard(model: &MeshModel, mesh: &Mesh) -> MeshModel {
    MeshModel {
        seq: model.seq / mesh.cp.max(1),
        ..*model
    }
}

/// Bytes per parameter of weights, gradients and Adam states with the ZeRO stage across the
/// `dp` ranks that share the weights (dp·cp under context parallelism).
pub fn bytes_per_parameter(framework: MeshFramework, zero: ZeroStage, dp: u64) -> f64 {
    let dp = dp as f64;
    match (framework, zero.number()) {
        (MeshFramework::Megatron, 0) => 18.0,
        (MeshFramework::Megatron, 1) => 6.0 + 12.0 / dp,
        (MeshFramework::Megatron, 2) => 2.0 + 16.0 / dp,
        (MeshFramework::Megatron, _) => 18.0 / dp,
        (MeshFramework::Torchtitan, 0) => 16.0,
        (MeshFramework::Torchtitan, 1) => 8.0 + 8.0 / dp,
        (MeshFramework::Torchtitan, 2) => 4.0 + 12.0 / dp,
        (MeshFramework::Torchtitan, _) => 16.0 / dp,
    }
}

/// The memory of every stage of `mesh` for `model` (one micro-batch of `model.micro_batch`
/// sequences per forward) with the ZeRO stage `zero` across dp, in `framework`'s layout.
pub fn mesh_memory(
    model: &MeshModel,
    mesh: &Mesh,
    framework: MeshFramework,
    zero: ZeroStage,
    recompute: Recompute,
) -> MeshMemory {
    let (p, t, v) = (mesh.pp, mesh.tp, mesh.schedule.chunks());
    let tf = t as f64;
    let full_seq = model.seq as f64;
    let model = &context_shard(model, mesh);
    let sp = if mesh.sequence_parallel { tf } else { 1.0 };
    let (s, b, h) = (
        model.seq as f64,
        model.micro_batch as f64,
        model.hidden as f64,
    );
    let local = model.seq as f64;
    let core_beyond_shard = match recompute {
        Recompute::None => 5.0 * model.heads as f64 * local * (full_seq - local) * b / tf,
        _ => 0.0,
    };
    let per_layer =
        layer_activation_bytes(model, t, mesh.sequence_parallel, recompute) + core_beyond_shard;
    let embedding = model.embedding_parameters() as f64 / tf;
    let stages = (0..p)
        .map(|i| {
            let layers = mesh.stage_layers(model.layers, i) as f64;
            let expert_parameters =
                layers * model.layer_expert_parameters() as f64 / (tf * mesh.ep as f64);
            let mut parameters = layers
                * (model.layer_dense_matrix_parameters() as f64 / tf
                    + model.layer_norm_parameters() as f64)
                + expert_parameters;
            if i == 0 {
                parameters += embedding;
            }
            if i == p - 1 {
                parameters += (model.norm_params * model.hidden) as f64;
                if !model.tied_embeddings || p > 1 {
                    parameters += embedding;
                }
            }
            // What one micro-batch of each chunk keeps: its layers' activations, plus the
            // token ids and embedding mask on the first chunk of stage 0, the output layer's
            // inputs and fp32 logits on the last chunk of the last stage.
            let weights: Vec<f64> = (0..v)
                .map(|c| {
                    let mut w = mesh.chunk_layers(model.layers, i, c) as f64 * per_layer;
                    if i == 0 && c == 0 {
                        w += 8.0 * s * b + s * b * h / sp;
                    }
                    if i == p - 1 && c == v - 1 {
                        let vocab = model.vocab as f64;
                        w += 4.0 * s * b * h / sp + 4.0 * s * b * vocab / tf;
                    }
                    w
                })
                .collect();
            let held = peak_in_flight(i, p, v, mesh.microbatches, &weights);
            let activations = held
                .iter()
                .zip(&weights)
                .map(|(n, w)| *n as f64 * w)
                .sum::<f64>();
            StageMemory {
                stage: i,
                layers: layers as u64,
                in_flight: held.iter().sum(),
                parameters,
                expert_parameters,
                model_states: (parameters - expert_parameters)
                    * bytes_per_parameter(framework, zero, mesh.dp * mesh.cp)
                    + expert_parameters
                        * bytes_per_parameter(framework, zero, mesh.dp * mesh.cp / mesh.ep),
                activations,
            }
        })
        .collect::<Vec<_>>();
    let peak_stage = stages.iter().enumerate().fold(0, |best, (i, st)| {
        if st.total() > stages[best].total() {
            i
        } else {
            best
        }
    }) as u64;
    MeshMemory {
        peak_rank: peak_stage * mesh.dp * mesh.cp * mesh.tp,
        peak_stage,
        stages,
    }
}
