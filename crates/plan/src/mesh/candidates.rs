//! Every mesh of tensor, pipeline and data parallelism that a model, a global batch and a
//! cluster admit: the space a mesh search ranks.
//!
//! tp runs over the divisors of the GPUs per node (tensor parallelism stays within a node), pp
//! over the stage counts that split the layers into whole chunks — evenly, or with one layer
//! fewer on the first and the last chunk when only L + 2 divides (Llama 3's 126 layers on 16
//! stages, Llama 3 paper §3.3.2) —, dp takes the remaining ranks, and m the global batch's
//! remaining factor; sequence parallelism is on whenever tp > 1 (it only lowers activation
//! memory, at the same communication volume; Korthikanti et al. 2022, §4.2.2). For pp ≥ 2 the
//! interleaved schedule is listed for every v ≥ 2 that splits the same way, when m is a multiple
//! of pp. Every candidate passes `Mesh::validate`.
//!
//! Expert parallelism, for a mixture of experts, runs over every ep that divides the experts and
//! the dp·cp ranks it is taken from (1 for a dense model).
//!
//! Context parallelism is not searched: `cp` (pinned by the caller, 1 otherwise) takes its ranks
//! before dp, as torchtitan's mesh does (dp × cp × tp within each pipeline stage).
//!
//! Not for: costing or ranking the candidates (`rank`, `time`).

use headroom_strategy::{Mesh, MeshShape, PipelineSchedule};

fn divisors(n: u64) -> impl Iterator<Item = u64> {
    (1..=n).filter(move |d| n.is_multiple_of(*d))
}

/// Layers the first and last chunk hold fewer so that `layers` split into `chunks` model chunks:
/// 0 when they divide evenly, else 1 when L + 2 does (Llama 3's split), else none.
pub(crate) fn fewer_at_ends(layers: u64, pp: u64, chunks: u64) -> Option<u64> {
    let n = pp * chunks;
    if layers.is_multiple_of(n) {
        Some(0)
    } else if pp >= 2 && (layers + 2).is_multiple_of(n) && (layers + 2) / n > 1 {
        Some(1)
    } else {
        None
    }
}

/// The valid meshes on `world` GPUs for `shape` with `cp` context-parallel ranks, in the order
/// tp, pp, schedule (1F1B first).
pub fn candidate_meshes(shape: &MeshShape, world: u64, cp: u64) -> Vec<Mesh> {
    let mut out = Vec::new();
    for tp in divisors(shape.gpus_per_node) {
        for pp in (1..=shape.layers).filter(|pp| world.is_multiple_of(tp * pp * cp)) {
            let dp = world / (tp * pp * cp);
            let per_step = dp * shape.micro_batch;
            if !shape.global_batch.is_multiple_of(per_step) {
                continue;
            }
            let eps: Vec<u64> = match shape.experts {
                0 => vec![1],
                e => divisors(e)
                    .filter(|ep| (dp * cp).is_multiple_of(*ep))
                    .collect(),
            };
            for ep in eps {
                let base = Mesh {
                    dp,
                    tp,
                    sequence_parallel: tp > 1,
                    pp,
                    schedule: PipelineSchedule::OneFOneB,
                    microbatches: shape.global_batch / per_step,
                    cp,
                    ep,
                    ..Mesh::default()
                };
                let schedules = (1..=shape.layers / pp).filter_map(|chunks| {
                    let k = fewer_at_ends(shape.layers, pp, chunks)?;
                    let schedule = if chunks == 1 {
                        PipelineSchedule::OneFOneB
                    } else {
                        PipelineSchedule::Interleaved { chunks }
                    };
                    Some(Mesh {
                        schedule,
                        fewer_layers_at_ends: k,
                        ..base
                    })
                });
                out.extend(schedules.filter(|m| m.validate(shape).is_ok()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_space_enumerated_by_hand() {
        // 4 layers, 4 heads, 2 KV heads, 2 GPUs per node, 4 GPUs, batch 4 of 1:
        // tp 1: pp 1 (dp 4, m 1); pp 2 (dp 2, m 2) 1F1B and interleaved:2; pp 4 (dp 1, m 4)
        // 1F1B only (one layer per stage). tp 2: pp 1 (dp 2, m 2); pp 2 (dp 1, m 4) 1F1B and
        // interleaved:2. Seven meshes.
        let shape = MeshShape {
            attention_heads: 4,
            kv_heads: 2,
            layers: 4,
            experts: 0,
            global_batch: 4,
            micro_batch: 1,
            gpus_per_node: 2,
        };
        let got: Vec<_> = candidate_meshes(&shape, 4, 1)
            .iter()
            .map(|m| (m.tp, m.pp, m.dp, m.microbatches, m.schedule.chunks()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, 1, 4, 1, 1),
                (1, 2, 2, 2, 1),
                (1, 2, 2, 2, 2),
                (1, 4, 1, 4, 1),
                (2, 1, 2, 2, 1),
                (2, 2, 1, 4, 1),
                (2, 2, 1, 4, 2),
            ]
        );
    }
}
