//! One mesh layout costed for a loaded model on the planner's hardware: the memory of every
//! pipeline stage's ranks (model states and activations from `rank`, plus the working buffers
//! a step allocates and the fragmentation reserve and CUDA context the single-device model
//! charges) and the step time (the planner's compute and memory-bound time of the same tokens,
//! spread over every GPU, with the mesh's collectives, sends, bubble and data-parallel traffic).
//!
//! Working buffers on top of `rank`'s model states and activations:
//! - ZeRO-3 (FSDP) gathers each layer's 16-bit parameters before it runs and prefetches the
//!   next (two layers' worth in flight), and holds one layer's unsharded fp32 gradients before
//!   its reduce-scatter; ZeRO-2 holds one layer's fp32 gradients (its reduction bucket).
//! - torchtitan's FSDP2 under pipeline parallelism keeps the stage gathered for the whole step:
//!   `apply_fsdp` sets `reshard_after_forward=False` when PP is on (no all-gather per
//!   micro-batch; pytorch/torchtitan `parallelisms/parallelize_llama.py`), and the pipeline
//!   stage runs every backward but the last with `set_requires_gradient_sync(False)` and
//!   `set_reshard_after_backward(False)` (`torch/distributed/pipelining/stage.py`), so FSDP2
//!   accumulates each unsharded gradient, upcast to the fp32 `reduce_dtype`
//!   (`FSDPParam.to_accumulated_grad_if_needed`, PyTorch 2.4–2.6). The stage's parameters
//!   cost 2 (bf16, gathered) + 4 (fp32 accumulated gradient) bytes more, plus one layer's bf16
//!   gradient before it is added.
//! - The loss's backward on the last stage, beside the 4sbV/t of fp32 log-probabilities the
//!   activations hold. torchtitan's eager `cross_entropy` on fp32 logits (tp 1) allocates the
//!   gradients of the log-probabilities and of the logits, 8sbV (`cost::activation::logits_grad`).
//!   Under TP it runs loss parallel (`torch.distributed.tensor.parallel.loss_parallel`, on by
//!   default in torchtitan), whose fused backward `_nll_loss_and_log_softmax_backward` holds a
//!   zero-filled gradient, `exp` of the log-probabilities, their sum and its product with the
//!   output gradient, three of them alive at once: 12sbV/t. Megatron-LM's fused vocabulary-parallel cross-entropy writes its gradient in place.
//!   They are freed before the last layer's recompute begins: the larger of the two counts.
//! - Full recompute re-runs one layer's forward in backward, holding that layer's activations
//!   (the selective-recompute bytes of one micro-batch) while its backward runs.
//! - A mixture of experts' dispatch (`expert_dispatch_bytes`): the routed copies of the tokens
//!   before and after the all-to-all, while an MoE layer runs.
//! - Context parallelism's attention over the whole sequence (`context_attention_bytes`): the
//!   keys and values all-gathered, the fp32 gradient accumulators and the gradients in flight
//!   around the ring, held while a layer's attention backward runs.
//!
//! Every term above is per context-parallel rank: s/cp of each sequence (`rank`).
//!
//! Time (one optimizer step): the compute and memory-bound seconds `cost::time` predicts for the
//! step's tokens on every GPU (the same FLOPs, recompute included, the same efficiency for the
//! micro-batch), split into m micro-batch slots, each slot adding the stage's TP collectives over
//! NVLink and its pipeline sends, over m + (p − 1)/v slots (`time::step_seconds`). Data
//! parallelism's traffic follows `cost::time`'s rules over the dp group's link (within a node
//! when tp·dp ≤ the GPUs per node, else between nodes), with fp32 gradients as Megatron-LM
//! reduces them: stages 0–1 2Ψ overlapped with the backward (⅔ of compute), stage 2 mΨ
//! overlapped plus Ψ exposed, stage 3 3Ψ per micro-batch overlapped with the whole compute; Ψ
//! the parameters of the most loaded rank. The optimizer step's memory traffic is left out (under
//! 0.2 % of the step for the meshes searched here).
//!
//! Attention is memory-efficient (flash attention, as Megatron-LM with Transformer Engine and
//! torchtitan run it), so "no checkpointing" keeps Korthikanti et al.'s selective-recompute
//! bytes (the s² scores never exist): the two levels are selective and full.
//!
//! Not for: which meshes exist (`candidates`) or which one to recommend (`search`).

use super::{
    LinkBandwidths, MeshFramework, MeshModel, Recompute, StageMemory, bubble_fraction,
    context_shard, cp_bytes_per_layer, ep_bytes_per_layer, layer_activation_bytes, mesh_memory,
    step_seconds,
};
use crate::cost::{Problem, time};
use crate::strategy::{
    Attention, Checkpoint, Loss, Mesh, Optimizer, Placement, Precision, Strategy, ZeroStage,
};
use serde::Serialize;

/// One pipeline stage's rank at its peak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StagePeak {
    pub stage: u64,
    /// Transformer layers this stage holds (all its chunks).
    pub layers: u64,
    /// Micro-batches whose activations it holds at its peak (chunk-micro-batches / v).
    pub in_flight: f64,
    pub parameters: f64,
    pub model_states_bytes: u64,
    pub activation_bytes: u64,
    /// Gathered parameters, unsharded gradients, the recomputed layer.
    pub buffer_bytes: u64,
    /// Everything above plus the fragmentation reserve and the CUDA context.
    pub peak_bytes: u64,
}

/// A mesh with its levers, memory per stage and step time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MeshPlan {
    pub mesh: Mesh,
    pub precision: Precision,
    pub zero_stage: ZeroStage,
    /// `selective` (Korthikanti's selective recompute, which flash attention gives for free) or
    /// `every:1` (full recompute of every layer).
    pub checkpoint: Checkpoint,
    /// Sequences per micro-batch on each data-parallel replica.
    pub micro_batch: u64,
    pub stages: Vec<StagePeak>,
    /// Index of the most loaded stage (the plan's peak).
    pub peak_stage: u64,
    /// The first global rank of that stage's tp group (Megatron-LM's rank order).
    pub peak_rank: u64,
    pub peak_bytes: u64,
    pub usable_bytes: u64,
    pub fits: bool,
    pub step_s: f64,
    pub tokens_per_s: f64,
    /// The pipeline's idle share: (p − 1)/(v·m).
    pub bubble: f64,
    /// Compute and memory-bound seconds per step, bubble excluded.
    pub compute_s: f64,
    /// Tensor-parallel collectives per step (not overlapped).
    pub tp_s: f64,
    /// Context parallelism's key/value exchanges per step (not overlapped).
    pub cp_s: f64,
    /// Expert parallelism's all-to-alls per step (not overlapped).
    pub ep_s: f64,
    /// Pipeline sends per step.
    pub pp_s: f64,
    /// Data-parallel traffic not hidden behind compute.
    pub dp_exposed_s: f64,
    /// Collective traffic per GPU per step, bytes (TP, PP and DP).
    pub communication_bytes_per_device: f64,
    pub mfu: f64,
}

impl MeshPlan {
    pub fn peak(&self) -> &StagePeak {
        &self.stages[self.peak_stage as usize]
    }

    /// Why the peak stage is the most loaded, in words.
    pub fn why_peak(&self) -> String {
        let st = self.peak();
        let p = self.mesh.pp;
        let mut parts = Vec::new();
        if p == 1 {
            parts.push("the only stage: every layer, the embedding and the output layer".into());
        } else {
            if st.stage == 0 {
                parts.push("the input embedding".to_string());
            }
            if st.stage == p - 1 {
                parts.push("the output layer and the loss's fp32 logits".to_string());
            }
            let schedule = match self.mesh.schedule.chunks() {
                1 => format!(
                    "1F1B warm-up: stage i holds min(p − i, m) = {} micro-batches",
                    st.in_flight
                ),
                v => format!(
                    "interleaved warm-up over {v} chunks: {} micro-batches' worth",
                    st.in_flight
                ),
            };
            parts.push(schedule);
        }
        format!(
            "stage {} (ranks {}–{}): {}",
            st.stage,
            self.peak_rank,
            self.peak_rank + self.mesh.tp - 1,
            parts.join("; ")
        )
    }
}

impl Recompute {
    /// The checkpoint policy of the vocabulary this level stands for.
    pub fn checkpoint(self) -> Checkpoint {
        match self {
            Recompute::Full => Checkpoint::ALL_BLOCKS,
            _ => Checkpoint::Selective,
        }
    }
}

/// The bandwidth, bytes per second per direction, of a group of ranks spanning `span`
/// consecutive ranks: NVLink when the span fits in a node, else the slower of it and the
/// inter-node link.
fn link_bandwidth(problem: &Problem, span: u64) -> f64 {
    let hw = &problem.hardware;
    let gbps = if span <= hw.gpus_per_node || hw.nodes == 1 {
        hw.intra_node_bandwidth_gbps
    } else {
        hw.intra_node_bandwidth_gbps
            .min(hw.inter_node_bandwidth_gbps)
    };
    gbps * 1e9
}

/// What one layer's attention under context parallelism holds beside the layer's activations
/// while its backward runs (`model` the whole sequence), from PyTorch's
/// `_templated_ring_attention_backward`: the whole sequence's keys and values all-gathered in
/// 16 bits (2 · 2 · s·b·d_kv/t), fp32 accumulators of the local queries', keys' and values'
/// gradients (4 · (s/cp)·b·(h + 2·d_kv)/t), and the fp32 key and value gradients in flight
/// around the ring, the one being sent and the one received (2 · 2 · 4 · (s/cp)·b·d_kv/t).
/// None without context parallelism.
pub fn context_attention_bytes(model: &MeshModel, mesh: &Mesh) -> f64 {
    if mesh.cp <= 1 {
        return 0.0;
    }
    let (c, t) = (mesh.cp as f64, mesh.tp as f64);
    let (s, b, h) = (
        model.seq as f64,
        model.micro_batch as f64,
        model.hidden as f64,
    );
    let kv = h * model.kv_heads as f64 / model.heads as f64;
    let gathered = 2.0 * 2.0 * s * b * kv / t;
    let accumulators = 4.0 * s / c * b * (h + 2.0 * kv) / t;
    let in_flight = 2.0 * 2.0 * 4.0 * s / c * b * kv / t;
    gathered + accumulators + in_flight
}

/// What a mixture-of-experts layer holds beside its activations while it dispatches (`model` a
/// rank's share of the sequence): the k routed copies of its tokens in 16 bits, before and
/// after the all-to-all, 2 · 2·s·b·k·h (/t under SP). None for a dense model.
pub fn expert_dispatch_bytes(model: &MeshModel, mesh: &Mesh) -> f64 {
    let Some(moe) = model.moe else {
        return 0.0;
    };
    let sp = if mesh.sequence_parallel {
        mesh.tp as f64
    } else {
        1.0
    };
    2.0 * 2.0 * (model.seq * model.micro_batch * moe.per_token * model.hidden) as f64 / sp
}

/// Costs `mesh` for `problem`'s model, at micro-batches of `micro_batch` sequences of the
/// workload's length, with the ZeRO stage across dp and the recompute level.
pub fn evaluate_mesh(
    problem: &Problem,
    model: &MeshModel,
    mesh: &Mesh,
    precision: Precision,
    zero_stage: ZeroStage,
    recompute: Recompute,
) -> MeshPlan {
    let micro_batch = model.micro_batch;
    let framework = MeshFramework::of(problem.framework);
    let memory = mesh_memory(model, mesh, framework, zero_stage, recompute);
    let tf = mesh.tp as f64;
    // One layer on one rank: its dense matrices over tp, its routed experts over tp·ep.
    let layer_params = model.layer_dense_matrix_parameters() as f64 / tf
        + model.layer_expert_parameters() as f64 / (tf * mesh.ep as f64);
    // What one context-parallel rank computes on: s/cp of each sequence.
    let shard = context_shard(model, mesh);
    let recomputed = match recompute {
        Recompute::Full => layer_activation_bytes(
            &shard,
            mesh.tp,
            mesh.sequence_parallel,
            Recompute::Selective,
        ),
        _ => 0.0,
    } + context_attention_bytes(model, mesh)
        + expert_dispatch_bytes(&shard, mesh);
    let kept_gathered = framework == MeshFramework::Torchtitan && mesh.pp > 1;
    let logits = (shard.seq * shard.micro_batch * shard.vocab) as f64 / tf;
    let loss_grads = match framework {
        // Under TP, torchtitan's loss parallel: three vocabulary-sized fp32 tensors.
        MeshFramework::Torchtitan if mesh.tp > 1 => 12.0 * logits,
        MeshFramework::Torchtitan => 8.0 * logits,
        MeshFramework::Megatron => 0.0,
    };
    let buffers = |st: &StageMemory| {
        let sharding = match zero_stage.number() {
            3 if kept_gathered => (2.0 + 4.0) * st.parameters + 2.0 * layer_params,
            3 => 2.0 * 2.0 * layer_params + 4.0 * layer_params,
            2 => 4.0 * layer_params,
            _ => 0.0,
        };
        // The loss's gradients are freed before the last layer's recompute begins.
        let loss = if st.stage == mesh.pp - 1 {
            loss_grads
        } else {
            0.0
        };
        sharding + recomputed.max(loss)
    };
    let frag = problem.cost.fragmentation;
    let ctx = problem.hardware.cuda_context_bytes as f64;
    let v = mesh.schedule.chunks();
    let stages: Vec<StagePeak> = memory
        .stages
        .iter()
        .map(|st| {
            let held = st.in_flight;
            let buffers = buffers(st);
            let allocated = st.model_states + st.activations + buffers;
            StagePeak {
                stage: st.stage,
                layers: st.layers,
                in_flight: held as f64 / v as f64,
                parameters: st.parameters,
                model_states_bytes: st.model_states.round() as u64,
                activation_bytes: st.activations.round() as u64,
                buffer_bytes: buffers.round() as u64,
                peak_bytes: (allocated * (1.0 + frag) + ctx).round() as u64,
            }
        })
        .collect();
    // The most loaded stage with the buffers and reserve counted (the first of equals).
    let peak_stage = stages.iter().enumerate().fold(0, |best, (i, st)| {
        if st.peak_bytes > stages[best].peak_bytes {
            i
        } else {
            best
        }
    });
    let peak_bytes = stages[peak_stage].peak_bytes;
    let usable_bytes = problem.usable_device_bytes();

    let strategy = Strategy {
        precision,
        optimizer: Optimizer::AdamW,
        placement: Placement {
            zero_stage,
            ..Placement::default()
        },
        checkpoint: match recompute {
            Recompute::Full => Checkpoint::ALL_BLOCKS,
            _ => Checkpoint::None,
        },
        attention: Attention::MemoryEfficient,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch,
        accumulation: mesh.microbatches,
    };
    let single = time::predict(problem, &strategy);
    let compute_s = single.compute_s + single.memory_bound_s;
    let m = mesh.microbatches as f64;
    // torchtitan's rank order within a pipeline stage is dp × cp × tp, tp fastest.
    let links = LinkBandwidths {
        tp: link_bandwidth(problem, mesh.tp),
        cp: link_bandwidth(problem, mesh.tp * mesh.cp),
        ep: link_bandwidth(problem, mesh.tp * mesh.ep),
        pp: link_bandwidth(problem, mesh.tp * mesh.cp * mesh.dp * 2),
    };
    let slots = step_seconds(model, mesh, recompute, compute_s / m, links);
    let bubble = bubble_fraction(mesh);
    let layers = mesh.max_stage_layers(model.layers) as f64;
    let tp_bytes = m * layers * super::tp_bytes_per_layer(&shard, mesh, recompute);
    let cp_bytes = m * layers * cp_bytes_per_layer(model, mesh, recompute);
    let ep_bytes = m * layers * ep_bytes_per_layer(&shard, mesh, recompute);
    let pp_bytes = m * super::pp_bytes_per_microbatch(&shard, mesh);
    let tp_s = tp_bytes / links.tp;
    let cp_s = cp_bytes / links.cp;
    let ep_s = ep_bytes / links.ep;
    let pp_s = pp_bytes / links.pp;

    // The weights' replicas: the dp·cp ranks of a stage's tp rank.
    let psi = stages[peak_stage].parameters;
    let dp = (mesh.dp * mesh.cp) as f64;
    let ring = if dp > 1.0 { (dp - 1.0) / dp } else { 0.0 };
    let (pb, gb) = (precision.param_bytes() as f64, 4.0);
    let (overlapped, exposed, window) = match zero_stage.number() {
        0 | 1 => (2.0 * psi * gb, 0.0, compute_s * 2.0 / 3.0),
        2 => (m * psi * gb, psi * pb, compute_s * 2.0 / 3.0),
        _ => (m * 3.0 * psi * pb, 0.0, compute_s),
    };
    let dp_bw = link_bandwidth(problem, mesh.tp * mesh.cp * mesh.dp);
    let dp_exposed_s = (overlapped * ring / dp_bw - window).max(0.0) + exposed * ring / dp_bw;
    let step_s = slots + dp_exposed_s;
    let peak_flops = time::peak_flops(problem, precision);
    let world = mesh.world_size() as f64;
    MeshPlan {
        mesh: *mesh,
        precision,
        zero_stage,
        checkpoint: recompute.checkpoint(),
        micro_batch,
        peak_stage: peak_stage as u64,
        peak_rank: peak_stage as u64 * mesh.dp * mesh.cp * mesh.tp,
        peak_bytes,
        usable_bytes,
        fits: peak_bytes <= usable_bytes,
        step_s,
        tokens_per_s: problem.workload.tokens_per_step() as f64 / step_s,
        bubble,
        compute_s,
        tp_s,
        cp_s,
        ep_s,
        pp_s,
        dp_exposed_s,
        communication_bytes_per_device: tp_bytes
            + cp_bytes
            + ep_bytes
            + pp_bytes
            + (overlapped + exposed) * ring,
        mfu: single.model_flops / (step_s * world * peak_flops),
        stages,
    }
}
