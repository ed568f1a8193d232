//! The device mesh of a run that outgrows data parallelism: tensor parallelism (with sequence
//! parallelism on or off), pipeline parallelism (1F1B or interleaved with v virtual stages, m
//! micro-batches per step), context parallelism and expert parallelism, beside data parallelism.
//! Every axis defaults to 1, which is the single-replica layout every other plan assumes.
//!
//! `Mesh::validate` checks the constraints Megatron-LM imposes (Narayanan et al. 2021,
//! arXiv:2104.04473; Korthikanti et al. 2022, arXiv:2205.05198): tensor parallelism within a
//! node, attention and key/value heads divisible by tp, layers by pp·v, experts by ep, the global
//! batch by dp·m·micro-batch.
//!
//! Not for: what a mesh costs (the planner's `mesh` module) or which mesh to pick (the search).

use crate::StrategyError;
use crate::named::serde_by_name;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// The order in which pipeline stages run their micro-batches' forwards and backwards. Its
/// CLI/TOML/JSON names: `1f1b`, `interleaved:V`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PipelineSchedule {
    /// One forward, one backward (PipeDream-Flush; Narayanan et al. 2021, §2.2): stage i runs
    /// p − i − 1 warm-up forwards before its first backward.
    #[default]
    OneFOneB,
    /// Interleaved 1F1B: each device holds `chunks` (v) non-adjacent model chunks
    /// (Narayanan et al. 2021, §2.2), cutting the bubble by v.
    Interleaved { chunks: u64 },
}

impl PipelineSchedule {
    /// Model chunks per pipeline rank (v): 1 for 1F1B.
    pub fn chunks(&self) -> u64 {
        match self {
            PipelineSchedule::OneFOneB => 1,
            PipelineSchedule::Interleaved { chunks } => *chunks,
        }
    }
}

impl PipelineSchedule {
    const FLAG: &'static str = "--pp-schedule";
    const ACCEPTED: &'static str = "1f1b, interleaved:V (V ≥ 2 model chunks per stage)";
}

impl std::fmt::Display for PipelineSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PipelineSchedule::OneFOneB => f.write_str("1f1b"),
            PipelineSchedule::Interleaved { chunks } => write!(f, "interleaved:{chunks}"),
        }
    }
}

impl FromStr for PipelineSchedule {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, StrategyError> {
        let bad = || StrategyError::Value {
            flag: PipelineSchedule::FLAG,
            value: s.to_string(),
            accepted: PipelineSchedule::ACCEPTED.into(),
        };
        if s == "1f1b" {
            return Ok(PipelineSchedule::OneFOneB);
        }
        let chunks: u64 = s
            .strip_prefix("interleaved:")
            .and_then(|v| v.parse().ok())
            .ok_or_else(bad)?;
        if chunks < 2 {
            return Err(bad());
        }
        Ok(PipelineSchedule::Interleaved { chunks })
    }
}

serde_by_name!(PipelineSchedule);

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

/// What of the model, the batch and the cluster the mesh must divide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshShape {
    pub attention_heads: u64,
    pub kv_heads: u64,
    pub layers: u64,
    /// Routed experts per MoE layer; 0 for a dense model.
    pub experts: u64,
    /// Sequences per optimizer step over the whole run.
    pub global_batch: u64,
    /// Sequences per micro-batch per data-parallel replica.
    pub micro_batch: u64,
    pub gpus_per_node: u64,
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

    /// The first constraint the mesh breaks for this model, batch and cluster, naming it and the
    /// fix.
    pub fn validate(&self, shape: &MeshShape) -> Result<(), StrategyError> {
        let bad = |why: String| Err(StrategyError::Incompatible(why));
        for (name, value) in [
            ("dp", self.dp),
            ("tp", self.tp),
            ("pp", self.pp),
            ("cp", self.cp),
            ("ep", self.ep),
            ("microbatches", self.microbatches),
            ("pipeline chunks", self.schedule.chunks()),
        ] {
            if value == 0 {
                return bad(format!("mesh {name} must be at least 1"));
            }
        }
        if self.tp > shape.gpus_per_node {
            return bad(format!(
                "tensor parallelism must stay within a node: tp {} exceeds the {} GPUs per node; \
                 use tp ≤ {} and pipeline or data parallelism across nodes",
                self.tp, shape.gpus_per_node, shape.gpus_per_node
            ));
        }
        if self.sequence_parallel && self.tp == 1 {
            return bad(
                "sequence parallelism shards across the tensor-parallel ranks: it needs tp ≥ 2"
                    .into(),
            );
        }
        if self.tp_comm_overlap && !self.sequence_parallel {
            return bad(
                "overlapping tensor parallelism's communication runs its all-gathers and \
                 reduce-scatters under the matmuls, which needs sequence parallelism on (and \
                 tp ≥ 2; Megatron-LM: \"Tensor parallel communication/GEMM overlap can happen \
                 only when sequence parallelism is enabled\")"
                    .into(),
            );
        }
        for (name, heads) in [
            ("attention heads", shape.attention_heads),
            ("key/value heads", shape.kv_heads),
        ] {
            if !heads.is_multiple_of(self.tp) {
                return bad(format!(
                    "the model's {heads} {name} are not divisible by tp {}: use a tp that divides {heads}",
                    self.tp
                ));
            }
        }
        let v = self.schedule.chunks();
        if let PipelineSchedule::Interleaved { chunks } = self.schedule {
            if self.pp < 2 || chunks < 2 {
                return bad(format!(
                    "the interleaved schedule needs pp ≥ 2 and at least 2 chunks per stage (pp {}, chunks {chunks}): use --pp-schedule 1f1b",
                    self.pp
                ));
            }
            // Megatron-LM runs the interleaved schedule in groups of pp micro-batches.
            if !self.microbatches.is_multiple_of(self.pp) {
                return bad(format!(
                    "the interleaved schedule runs micro-batches in groups of pp: {} micro-batches are not divisible by pp {}",
                    self.microbatches, self.pp
                ));
            }
        }
        let k = self.fewer_layers_at_ends;
        if k > 0 && self.pp < 2 {
            return bad(format!(
                "fewer layers on the first and last pipeline stage ({k}) needs a pipeline: pp ≥ 2"
            ));
        }
        let n = self.pp * v;
        if !(shape.layers + 2 * k).is_multiple_of(n) || (shape.layers + 2 * k) / n <= k {
            return bad(if k == 0 {
                format!(
                    "the model's {} layers are not divisible by pp·v = {}·{v}: pick a pp and chunk count whose product divides {}, or take layers off the first and last stage",
                    shape.layers, self.pp, shape.layers
                )
            } else {
                format!(
                    "the model's {} layers with {k} fewer on the first and last chunk do not split into pp·v = {}·{v} chunks: {} + 2·{k} must be a multiple of {n}",
                    shape.layers, self.pp, shape.layers
                )
            });
        }
        if self.ep > 1 {
            if shape.experts == 0 {
                return bad(format!(
                    "expert parallelism ep {} needs a mixture-of-experts model; this one is dense: use ep 1",
                    self.ep
                ));
            }
            if !shape.experts.is_multiple_of(self.ep) {
                return bad(format!(
                    "the model's {} experts are not divisible by ep {}",
                    shape.experts, self.ep
                ));
            }
            if !(self.dp * self.cp).is_multiple_of(self.ep) {
                return bad(format!(
                    "expert parallelism runs over the data- and context-parallel ranks: ep {} must divide dp·cp = {}",
                    self.ep,
                    self.dp * self.cp
                ));
            }
        }
        let per_step = self.dp * self.microbatches * shape.micro_batch;
        if shape.global_batch != per_step {
            return bad(format!(
                "the global batch of {} sequences must equal dp·m·micro-batch = {}·{}·{} = {per_step}",
                shape.global_batch, self.dp, self.microbatches, shape.micro_batch
            ));
        }
        Ok(())
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
    fn gpt3() -> MeshShape {
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

    fn megatron_175b() -> Mesh {
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

    fn refused(mesh: Mesh, shape: MeshShape, words: &[&str]) {
        let e = mesh.validate(&shape).unwrap_err().to_string();
        for w in words {
            assert!(e.contains(w), "{e} lacks {w}");
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

    #[test]
    fn schedules_parse_and_print_their_cli_names() {
        assert_eq!("1f1b".parse(), Ok(PipelineSchedule::OneFOneB));
        let v4 = PipelineSchedule::Interleaved { chunks: 4 };
        assert_eq!("interleaved:4".parse(), Ok(v4));
        assert_eq!(v4.to_string(), "interleaved:4");
        for bad in ["gpipe", "interleaved", "interleaved:1", "interleaved:x"] {
            let e = bad.parse::<PipelineSchedule>().unwrap_err().to_string();
            assert!(e.contains("--pp-schedule") && e.contains(bad), "{e}");
        }
        // A mesh in JSON uses the same names.
        let mesh = megatron_175b();
        let json = serde_json::to_value(mesh).unwrap();
        assert_eq!(json["schedule"], "interleaved:2");
        assert_eq!(serde_json::from_value::<Mesh>(json).unwrap(), mesh);
    }

    #[test]
    fn a_published_mesh_is_valid() {
        let m = megatron_175b();
        assert_eq!(m.validate(&gpt3()), Ok(()));
        assert_eq!(m.world_size(), 768);
    }

    #[test]
    fn each_constraint_is_named() {
        let ok = megatron_175b();
        refused(Mesh { tp: 16, ..ok }, gpt3(), &["within a node", "tp 16"]);
        let llama = MeshShape {
            attention_heads: 64,
            kv_heads: 8,
            layers: 80,
            ..gpt3()
        };
        // 64 heads divide by 16 but 8 KV heads do not (tp 16 on a 16-GPU node).
        refused(
            Mesh { tp: 16, ..ok },
            MeshShape {
                gpus_per_node: 16,
                ..llama
            },
            &["8 key/value heads", "tp 16"],
        );
        refused(
            Mesh { tp: 5, ..ok },
            gpt3(),
            &["96 attention heads", "tp 5"],
        );
        // 96 layers = 8·12, not divisible by 8·5 = 40.
        refused(
            Mesh {
                schedule: PipelineSchedule::Interleaved { chunks: 5 },
                ..ok
            },
            gpt3(),
            &["96 layers", "pp·v = 8·5"],
        );
        refused(
            Mesh {
                microbatches: 100,
                ..ok
            },
            gpt3(),
            &["groups of pp"],
        );
        refused(
            Mesh {
                schedule: PipelineSchedule::OneFOneB,
                microbatches: 100,
                ..ok
            },
            gpt3(),
            &["global batch of 1536", "12·100·1 = 1200"],
        );
        refused(Mesh { ep: 2, ..ok }, gpt3(), &["dense"]);
        let moe = MeshShape {
            experts: 8,
            ..gpt3()
        };
        assert_eq!(Mesh { ep: 4, ..ok }.validate(&moe), Ok(()));
        refused(Mesh { ep: 3, ..ok }, moe, &["8 experts", "ep 3"]);
        refused(
            Mesh {
                tp: 1,
                sequence_parallel: true,
                ..Mesh::default()
            },
            MeshShape {
                global_batch: 1,
                ..gpt3()
            },
            &["tp ≥ 2"],
        );
        refused(Mesh { pp: 0, ..ok }, gpt3(), &["pp must be at least 1"]);
    }
}
