//! The communication and idle time a mesh adds to a training step: tensor parallelism's
//! collectives per layer, the pipeline's point-to-point sends and its bubble.
//!
//! - TP (Megatron-LM; Narayanan et al. 2021, arXiv:2104.04473, §3): each layer runs two
//!   all-reduces of its s·b·h output in the forward and two in the backward (with sequence
//!   parallelism a reduce-scatter and an all-gather in place of each, the same volume;
//!   Korthikanti et al. 2022, §4.2.2). A ring all-reduce sends 2(t − 1)/t of the tensor from each
//!   rank. Full recompute runs the forward's two again in the backward.
//! - PP: per micro-batch and stage boundary one activation forward and one gradient backward of
//!   s·b·h elements (s·b·h/t under SP, where the activations are sequence-split); the
//!   interleaved schedule crosses v times as many boundaries (Narayanan et al. 2021, §2.2).
//! - Bubble: a step of m micro-batches on p stages lasts m + (p − 1)/v micro-batch slots instead
//!   of m, so the bubble is (p − 1)/(v·m) of the ideal time (Narayanan et al. 2021, §2.2).
//!
//! - TP overlap (`Mesh::tp_comm_overlap`: Megatron-LM's `--tp-comm-overlap`, torchtitan's async
//!   TP): the sequence-parallel all-gathers and reduce-scatters run in chunks under the
//!   projections' matmuls (Wang et al. 2023, "Overlap communication with dependent computation
//!   via decomposition", ASPLOS; PyTorch's "Distributed w/ TorchTitan: Introducing Async Tensor
//!   Parallelism"), so a slot pays the larger of the compute and TP's communication rather than
//!   their sum.
//!
//! Otherwise no overlap of communication with computation is assumed (Megatron-LM's default
//! without `--tp-comm-overlap`).
//!
//! Not for: the compute time of a layer (the planner's efficiency model) or data parallelism's
//! gradient reduction (`cost::time`).

use super::{MeshModel, Recompute};
use headroom_strategy::Mesh;

/// Bytes of one 16-bit activation element.
const ACTIVATION_BYTES: f64 = 2.0;

/// The fraction of the ideal step the pipeline's bubble adds: (p − 1)/(v·m).
pub fn bubble_fraction(mesh: &Mesh) -> f64 {
    (mesh.pp - 1) as f64 / (mesh.schedule.chunks() * mesh.microbatches) as f64
}

/// Bytes one rank sends for tensor parallelism in one layer's forward and backward of one
/// micro-batch.
pub fn tp_bytes_per_layer(model: &MeshModel, mesh: &Mesh, recompute: Recompute) -> f64 {
    if mesh.tp == 1 {
        return 0.0;
    }
    let t = mesh.tp as f64;
    let tensor = ACTIVATION_BYTES * (model.seq * model.micro_batch * model.hidden) as f64;
    let collectives = if recompute == Recompute::Full {
        6.0
    } else {
        4.0
    };
    collectives * 2.0 * (t - 1.0) / t * tensor
}

/// Bytes one rank of an inner stage sends to its neighbours per micro-batch (the activation
/// forward, the gradient backward, once per model chunk).
pub fn pp_bytes_per_microbatch(model: &MeshModel, mesh: &Mesh) -> f64 {
    if mesh.pp == 1 {
        return 0.0;
    }
    let sp = if mesh.sequence_parallel {
        mesh.tp as f64
    } else {
        1.0
    };
    let chunks = mesh.schedule.chunks() as f64;
    chunks * 2.0 * ACTIVATION_BYTES * (model.seq * model.micro_batch * model.hidden) as f64 / sp
}

/// Bytes one context-parallel rank receives per layer and micro-batch for attention over the
/// whole sequence (`model` the whole sequence, not a rank's shard): PyTorch's context
/// parallelism all-gathers the keys and values (2 · 2 · s·b·d_kv/t bytes in 16 bits, of which a
/// rank receives (cp − 1)/cp) before each attention forward — twice under full recompute — and
/// once more in backward, where it also passes the fp32 gradients of its local keys and values
/// around the ring, cp − 1 hops of 2 · 4 · (s/cp)·b·d_kv/t (`_templated_ring_attention_backward`:
/// an all-gather rotater for the keys and values, an all-to-all one for their gradients).
pub fn cp_bytes_per_layer(model: &MeshModel, mesh: &Mesh, recompute: Recompute) -> f64 {
    let c = mesh.cp as f64;
    if mesh.cp <= 1 {
        return 0.0;
    }
    let t = mesh.tp as f64;
    let kv = (model.seq * model.micro_batch * model.hidden * model.kv_heads / model.heads) as f64;
    let gathers = if recompute == Recompute::Full {
        3.0
    } else {
        2.0
    };
    let gather = (c - 1.0) / c * 2.0 * ACTIVATION_BYTES * kv / t;
    let gradients = (c - 1.0) * 2.0 * 4.0 * kv / c / t;
    gathers * gather + gradients
}

/// Bytes one expert-parallel rank sends per mixture-of-experts layer and micro-batch (`model` a
/// rank's share of the sequence): each of its tokens goes to k experts, 2·s·b·k·h bytes in 16
/// bits (/t under SP, where a tp rank routes its own part of the sequence), of which (ep − 1)/ep
/// leave the rank, in the all-to-all that dispatches them and the one that combines the
/// results, forward and backward (and once more forward under full recompute).
pub fn ep_bytes_per_layer(model: &MeshModel, mesh: &Mesh, recompute: Recompute) -> f64 {
    let Some(moe) = model.moe else {
        return 0.0;
    };
    if mesh.ep <= 1 {
        return 0.0;
    }
    let ep = mesh.ep as f64;
    let sp = if mesh.sequence_parallel {
        mesh.tp as f64
    } else {
        1.0
    };
    let tokens = (model.seq * model.micro_batch * moe.per_token * model.hidden) as f64 / sp;
    let passes = if recompute == Recompute::Full {
        6.0
    } else {
        4.0
    };
    passes * (ep - 1.0) / ep * ACTIVATION_BYTES * tokens
}

/// Seconds of one optimizer step on the mesh, given `model` (its whole sequence), the seconds
/// one stage's rank computes one micro-batch's forward and backward, and the tensor-parallel,
/// pipeline and context-parallel links' bandwidths (bytes per second, per direction): every
/// micro-batch slot is the computation plus the stage's TP collectives, its CP and EP exchanges
/// and its sends (TP and sends on each rank's s/cp of the sequence), and the step is m + (p − 1)/v slots.
pub fn step_seconds(
    model: &MeshModel,
    mesh: &Mesh,
    recompute: Recompute,
    compute_per_microbatch: f64,
    bandwidths: LinkBandwidths,
) -> f64 {
    // The slowest stage sets the slot: its share of the layers against the even L/p.
    let layers = mesh.max_stage_layers(model.layers) as f64;
    let imbalance = layers * mesh.pp as f64 / model.layers as f64;
    let shard = super::context_shard(model, mesh);
    let tp = layers * tp_bytes_per_layer(&shard, mesh, recompute) / bandwidths.tp;
    let cp = layers * cp_bytes_per_layer(model, mesh, recompute) / bandwidths.cp;
    let ep = layers * ep_bytes_per_layer(&shard, mesh, recompute) / bandwidths.ep;
    let pp = pp_bytes_per_microbatch(&shard, mesh) / bandwidths.pp;
    let compute = compute_per_microbatch * imbalance;
    let compute_and_tp = match mesh.tp_comm_overlap {
        true => compute.max(tp),
        false => compute + tp,
    };
    let slot = compute_and_tp + cp + ep + pp;
    mesh.microbatches as f64 * (1.0 + bubble_fraction(mesh)) * slot
}

/// Bandwidths, bytes per second per direction, of the links a mesh's groups run over.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkBandwidths {
    pub tp: f64,
    pub cp: f64,
    pub ep: f64,
    pub pp: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_strategy::PipelineSchedule;

    /// s = 8, b = 2, h = 16: one s·b·h tensor is 256 elements, 512 bytes; 4 layers.
    fn tiny() -> MeshModel {
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

    fn mesh(schedule: PipelineSchedule) -> Mesh {
        Mesh {
            tp: 4,
            sequence_parallel: true,
            pp: 2,
            schedule,
            microbatches: 4,
            ..Mesh::default()
        }
    }

    #[test]
    fn the_bubble_is_p_minus_1_over_v_m() {
        // (2 − 1)/4 for 1F1B, (2 − 1)/(2·4) interleaved.
        assert_eq!(bubble_fraction(&mesh(PipelineSchedule::OneFOneB)), 0.25);
        assert_eq!(
            bubble_fraction(&mesh(PipelineSchedule::Interleaved { chunks: 2 })),
            0.125
        );
        assert_eq!(bubble_fraction(&Mesh::default()), 0.0);
    }

    #[test]
    fn collective_volumes_by_hand() {
        let m = mesh(PipelineSchedule::OneFOneB);
        // 4 all-reduces × 2·3/4 × 512 B = 3072; full recompute 6 × 768 = 4608.
        assert_eq!(
            tp_bytes_per_layer(&tiny(), &m, Recompute::Selective),
            3072.0
        );
        assert_eq!(tp_bytes_per_layer(&tiny(), &m, Recompute::Full), 4608.0);
        // Forward and backward of 512 B / t = 128 B each.
        assert_eq!(pp_bytes_per_microbatch(&tiny(), &m), 256.0);
        // Twice as many boundaries with two chunks per stage.
        let interleaved = mesh(PipelineSchedule::Interleaved { chunks: 2 });
        assert_eq!(pp_bytes_per_microbatch(&tiny(), &interleaved), 512.0);
        assert_eq!(
            tp_bytes_per_layer(&tiny(), &Mesh::default(), Recompute::None),
            0.0
        );
    }

    #[test]
    fn the_step_is_m_plus_the_bubble_slots() {
        // Slot: 1 s compute + 2 layers × 3072 B at 6144 B/s (1 s) + 256 B at 256 B/s (1 s) =
        // 3 s; m + (p − 1) = 5 slots: 15 s.
        let m = mesh(PipelineSchedule::OneFOneB);
        let links = LinkBandwidths {
            tp: 6144.0,
            cp: 1.0,
            ep: 1.0,
            pp: 256.0,
        };
        let t = step_seconds(&tiny(), &m, Recompute::Selective, 1.0, links);
        assert_eq!(t, 15.0);
        // With TP's communication under the matmuls the slot is max(1 s, 1 s) + 1 s = 2 s:
        // 10 s; and a TP exchange longer than the compute shows only its excess.
        let overlapped = Mesh {
            tp_comm_overlap: true,
            ..m
        };
        let t = step_seconds(&tiny(), &overlapped, Recompute::Selective, 1.0, links);
        assert_eq!(t, 10.0);
        let t = step_seconds(&tiny(), &overlapped, Recompute::Selective, 0.5, links);
        assert_eq!(t, 10.0);
    }
}
