//! `Mesh::validate` checks the constraints Megatron-LM imposes (Narayanan et al. 2021,
//! arXiv:2104.04473; Korthikanti et al. 2022, arXiv:2205.05198): tensor parallelism within a
//! node, attention and key/value heads divisible by tp, layers by pp·v, experts by ep, the global
//! batch by dp·m·micro-batch.
//!
//! Not for: the mesh's axes (`Mesh`) or what a mesh costs (the planner's `mesh` module).

use super::{Mesh, PipelineSchedule};
use crate::StrategyError;

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
    use crate::mesh::tests::{gpt3, megatron_175b};

    fn refused(mesh: Mesh, shape: MeshShape, words: &[&str]) {
        let e = mesh.validate(&shape).unwrap_err().to_string();
        for w in words {
            assert!(e.contains(w), "{e} lacks {w}");
        }
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
