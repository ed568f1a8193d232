//! The device mesh of a run that outgrows data parallelism: tensor parallelism (with sequence
//! parallelism on or off), pipeline parallelism (1F1B or interleaved with v virtual stages, m
//! micro-batches per step), context parallelism and expert parallelism, beside data parallelism.
//! Every axis defaults to 1, which is the single-replica layout every other plan assumes.
//!
//! The pipeline schedule is in `schedule`, the constraints `Mesh::validate` checks in
//! `validate`.
//!
//! Not for: what a mesh costs (the planner's `mesh` module) or which mesh to pick (the search).

mod schedule;
mod validate;

use serde::{Deserialize, Serialize};

pub use schedule::PipelineSchedule;
pub use validate::MeshShape;

/// The parallel layout of one run: how many ranks along each axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mesh {
    /// Data-parallel replicas (the ZeRO stage shards across these).
    pub dp: u64,
    /// Tensor-parallel ranks (Megatron's column/row-parallel linears).
    pub tp: u64,
    /// Sequence parallelism: the LayerNorm and dropout regions sharded along the sequence across
    /// the tp ranks (Korthikanti et al. 2022, §4.2.2).
    pub sequence_parallel: bool,
    /// Pipeline stages.
    pub pp: u64,
    /// The pipeline schedule.
    pub schedule: PipelineSchedule,
    /// Micro-batches per optimizer step (m; the accumulation when pp is 1).
    pub microbatches: u64,
    /// Context-parallel ranks (each holds s/cp of the sequence).
    pub cp: u64,
    /// Expert-parallel ranks (each holds experts/ep of every MoE layer's experts).
    pub ep: u64,
    /// Layers the first and the last model chunk each hold fewer than the others, to balance
    /// the embedding and the output layer they also hold: Llama 3 ran its 126 layers on 16
    /// stages with one layer fewer on the first and the last (Llama 3 paper §3.3.2); torchtitan
    /// defaults to the same (`pipeline_parallel_first_stage_less_layers`), Megatron-LM takes
    /// `--decoder-first-pipeline-num-layers`. 0 splits the layers evenly.
    #[serde(default)]
    pub fewer_layers_at_ends: u64,
    /// Tensor parallelism's collectives overlapped with the layer's matmuls (Megatron-LM's
    /// `--tp-comm-overlap`, which needs sequence parallelism; torchtitan's async TP,
    /// `enable_async_tensor_parallel`, which needs torch.compile): the all-gather before and
    /// the reduce-scatter after each projection run in chunks under its GEMM.
    #[serde(default)]
    pub tp_comm_overlap: bool,
}

impl Default for Mesh {
    fn default() -> Self {
        Mesh {
            dp: 1,
            tp: 1,
            sequence_parallel: false,
            pp: 1,
            schedule: PipelineSchedule::OneFOneB,
            microbatches: 1,
            cp: 1,
            ep: 1,
            fewer_layers_at_ends: 0,
            tp_comm_overlap: false,
        }
    }
}

impl Mesh {
    /// Ranks in the whole run: dp · tp · pp · cp (expert parallelism reuses the dp·cp ranks, as
    /// in Megatron-LM's MoE layers, so it does not multiply the world).
    pub fn world_size(&self) -> u64 {
        self.dp * self.tp * self.pp * self.cp
    }

    /// True for the single-replica layout (every axis 1): the plan is the one without a mesh.
    pub fn is_single(&self) -> bool {
        *self == Mesh::default()
    }

    /// Model chunks on the whole pipeline (pp · v).
    pub fn virtual_stages(&self) -> u64 {
        self.pp * self.schedule.chunks()
    }

    /// Layers of chunk `chunk` of pipeline stage `stage` (virtual stage chunk·pp + stage) for a
    /// model of `layers` layers: (L + 2k)/(pp·v) each, k fewer on the first and the last chunk.
    pub fn chunk_layers(&self, layers: u64, stage: u64, chunk: u64) -> u64 {
        let k = self.fewer_layers_at_ends;
        let n = self.virtual_stages();
        let per = (layers + 2 * k) / n;
        let j = chunk * self.pp + stage;
        if j == 0 || j == n - 1 { per - k } else { per }
    }

    /// Layers pipeline stage `stage` holds over all its chunks.
    pub fn stage_layers(&self, layers: u64, stage: u64) -> u64 {
        (0..self.schedule.chunks())
            .map(|c| self.chunk_layers(layers, stage, c))
            .sum()
    }

    /// The most layers any pipeline stage holds (the slowest stage's share of the compute).
    pub fn max_stage_layers(&self, layers: u64) -> u64 {
        (0..self.pp)
            .map(|i| self.stage_layers(layers, i))
            .max()
            .unwrap_or(layers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_layer_fewer_at_each_end_splits_126_layers() {
        // Llama 3.1 405B: 126 layers (Llama 3 paper, Table 3), 128 heads over 8 KV heads.
        let shape = MeshShape {
            attention_heads: 128,
            kv_heads: 8,
            layers: 126,
            experts: 0,
            global_batch: 256,
            micro_batch: 1,
            gpus_per_node: 8,
        };
        let even = Mesh {
            dp: 8,
            tp: 8,
            sequence_parallel: true,
            pp: 8,
            microbatches: 32,
            ..Mesh::default()
        };
        // 126 = 2·3²·7 is not a multiple of 8.
        let e = even.validate(&shape).unwrap_err().to_string();
        assert!(
            e.contains("take layers off the first and last stage"),
            "{e}"
        );
        // (126 + 2)/8 = 16: stages of 15, 16 × 6, 15.
        let uneven = Mesh {
            fewer_layers_at_ends: 1,
            ..even
        };
        uneven.validate(&shape).unwrap();
        let layers: Vec<u64> = (0..8).map(|i| uneven.stage_layers(126, i)).collect();
        assert_eq!(layers, vec![15, 16, 16, 16, 16, 16, 16, 15]);
        assert_eq!(uneven.max_stage_layers(126), 16);
        // Interleaved over 4 stages with 2 chunks: 8 chunks of 16, the first (stage 0 chunk 0)
        // and the last (stage 3 chunk 1) 15: stages 31, 32, 32, 31.
        let looped = Mesh {
            pp: 4,
            dp: 16,
            microbatches: 16,
            schedule: PipelineSchedule::Interleaved { chunks: 2 },
            ..uneven
        };
        looped.validate(&shape).unwrap();
        assert_eq!(looped.chunk_layers(126, 0, 0), 15);
        assert_eq!(looped.chunk_layers(126, 0, 1), 16);
        assert_eq!(looped.chunk_layers(126, 3, 1), 15);
        let layers: Vec<u64> = (0..4).map(|i| looped.stage_layers(126, i)).collect();
        assert_eq!(layers, vec![31, 32, 32, 31]);
        // 130 + 2 = 132 is not a multiple of 8: refused with the arithmetic.
        let e = uneven
            .validate(&MeshShape {
                layers: 130,
                ..shape
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("130 + 2·1 must be a multiple of 8"), "{e}");
    }

    /// GPT-3 175B (Brown et al. 2020: 96 layers, 96 heads) on 8-GPU nodes, batch 1536.
    pub(super) fn gpt3() -> MeshShape {
        MeshShape {
            attention_heads: 96,
            kv_heads: 96,
            layers: 96,
            experts: 0,
            global_batch: 1536,
            micro_batch: 1,
            gpus_per_node: 8,
        }
    }

    pub(super) fn megatron_175b() -> Mesh {
        // Narayanan et al. 2021, Table 1: (t, p) = (8, 8); dp 12 on 768 GPUs, m = 1536/12 = 128.
        Mesh {
            dp: 12,
            tp: 8,
            sequence_parallel: true,
            pp: 8,
            schedule: PipelineSchedule::Interleaved { chunks: 2 },
            microbatches: 128,
            ..Mesh::default()
        }
    }

    #[test]
    fn the_default_is_one_everywhere_and_valid_for_any_model() {
        let m = Mesh::default();
        assert!(m.is_single());
        assert_eq!(m.world_size(), 1);
        let shape = MeshShape {
            global_batch: 1,
            ..gpt3()
        };
        assert_eq!(m.validate(&shape), Ok(()));
    }
}
