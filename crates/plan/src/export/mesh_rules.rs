//! The documented working combinations of the mesh frameworks, checked on the written
//! configuration: torchtitan's job TOML and Megatron-LM's arguments. Each rule names the check
//! in the framework's source that would stop the run (torchtitan v0.2.2; Megatron-LM's
//! `megatron/training/arguments.py`), so a file that parses but would fail at start-up is
//! never written.
//!
//! Not for: the DeepSpeed, Accelerate, torchtune and PEFT rules (`rules`).

use std::fmt;
use toml::Table;

/// A documented rule a mesh configuration breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MeshRule {
    /// "DDP has not supported > 1D parallelism" (`torchtitan/models/llama3/infra/parallelize.py`).
    DdpWithOtherParallelism,
    /// The stages per pipeline rank that torchtitan derives from
    /// `pipeline_parallel_layers_per_stage` (`torchtitan/distributed/pipeline_parallel.py`):
    /// a whole number of stages per rank, one for single-stage schedules (1F1B), at least two
    /// for looped ones (Interleaved1F1B).
    StagesPerRank { schedule: String, stages: String },
    /// The local batch is cut into micro-batches of `pipeline_parallel_microbatch_size`
    /// (`job_config.py`, `Parallelism.pipeline_parallel_microbatch_size`).
    MicrobatchSplit { local: i64, size: i64 },
    /// "Async TP requires 'model' in --compile.components and --compile.enable"
    /// (`torchtitan/distributed/tensor_parallel.py`, `maybe_enable_async_tp`).
    AsyncTpWithoutCompile,
    /// Megatron-LM's micro-batch calculator asserts that the global batch is divisible by the
    /// micro-batch size times the data-parallel size (`megatron/core/num_microbatches_calculator.py`).
    GlobalBatchSplit { global: u64, micro: u64, dp: u64 },
    /// "number of layers of the model must be divisible pipeline model parallel size" and "number
    /// of layers per pipeline stage must be divisible number of layers per virtual pipeline
    /// stage" (`arguments.py`); with an uneven split, "the left over layers must be divisible by
    /// left over stages" (`megatron/core/transformer/transformer_block.py`).
    LayerSplit {
        layers: u64,
        pp: u64,
        per_chunk: u64,
    },
    /// Megatron-LM turns sequence parallelism off when the tensor-parallel size is 1
    /// (`arguments.py`: "Disabling sequence parallelism because tensor model parallelism is
    /// disabled"), so the plan's sharded activations would not be.
    SequenceParallelWithoutTp,
    /// "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is
    /// enabled" (`megatron/training/arguments.py`).
    TpCommOverlapWithoutSp,
}

impl fmt::Display for MeshRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MeshRule::DdpWithOtherParallelism => write!(
                f,
                "data_parallel_replicate_degree > 1 beside another parallelism, which torchtitan refuses (\"DDP has not supported > 1D parallelism\")"
            ),
            MeshRule::StagesPerRank { schedule, stages } => write!(
                f,
                "{schedule} with {stages} stages per pipeline rank; torchtitan needs exactly one for 1F1B and at least two for Interleaved1F1B"
            ),
            MeshRule::MicrobatchSplit { local, size } => write!(
                f,
                "local_batch_size {local} is not a multiple of pipeline_parallel_microbatch_size {size}"
            ),
            MeshRule::AsyncTpWithoutCompile => write!(
                f,
                "enable_async_tensor_parallel without [compile] enable, which torchtitan refuses (\"Async TP requires 'model' in --compile.components and --compile.enable\")"
            ),
            MeshRule::GlobalBatchSplit { global, micro, dp } => write!(
                f,
                "--global-batch-size {global} is not divisible by --micro-batch-size {micro} × data-parallel size {dp}, which Megatron-LM refuses"
            ),
            MeshRule::LayerSplit {
                layers,
                pp,
                per_chunk,
            } => write!(
                f,
                "{layers} layers do not split into {pp} pipeline stages of whole chunks of {per_chunk} layers, which Megatron-LM refuses"
            ),
            MeshRule::SequenceParallelWithoutTp => write!(
                f,
                "--sequence-parallel with --tensor-model-parallel-size 1, which Megatron-LM turns off (\"Disabling sequence parallelism because tensor model parallelism is disabled\")"
            ),
            MeshRule::TpCommOverlapWithoutSp => write!(
                f,
                "--tp-comm-overlap without --sequence-parallel, which Megatron-LM refuses (\"Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled\")"
            ),
        }
    }
}

fn int(job: &Table, section: &str, key: &str, default: i64) -> i64 {
    job.get(section)
        .and_then(|s| s.get(key))
        .and_then(|v| v.as_integer())
        .unwrap_or(default)
}

fn flag(job: &Table, section: &str, key: &str) -> bool {
    job.get(section)
        .and_then(|s| s.get(key))
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

/// torchtitan's job TOML for a model of `layers` layers.
pub fn torchtitan(job: &Table, layers: u64) -> Result<(), MeshRule> {
    let p = "parallelism";
    let replicate = int(job, p, "data_parallel_replicate_degree", 1);
    let others = [
        int(job, p, "data_parallel_shard_degree", -1),
        int(job, p, "tensor_parallel_degree", 1),
        int(job, p, "pipeline_parallel_degree", 1),
        int(job, p, "context_parallel_degree", 1),
    ];
    if replicate > 1 && others.iter().any(|d| *d > 1) {
        return Err(MeshRule::DdpWithOtherParallelism);
    }
    let pp = others[2];
    if pp > 1 {
        let schedule = job[p]
            .get("pipeline_parallel_schedule")
            .and_then(|v| v.as_str())
            .unwrap_or("1F1B")
            .to_string();
        let per_stage = int(job, p, "pipeline_parallel_layers_per_stage", 0);
        let extra = int(job, p, "pipeline_parallel_first_stage_less_layers", 1)
            + int(job, p, "pipeline_parallel_last_stage_less_layers", 1);
        let stages = if per_stage > 0 {
            (layers as i64 + extra + per_stage - 1) / per_stage
        } else {
            0
        };
        let looped = schedule != "1F1B" && schedule != "GPipe";
        let per_rank_ok = stages > 0
            && stages % pp == 0
            && if looped {
                stages / pp >= 2
            } else {
                stages / pp == 1
            };
        if !per_rank_ok {
            return Err(MeshRule::StagesPerRank {
                schedule,
                stages: format!("{stages}/{pp}"),
            });
        }
        let local = int(job, "training", "local_batch_size", 8);
        let size = int(job, p, "pipeline_parallel_microbatch_size", 1);
        if size < 1 || local % size != 0 {
            return Err(MeshRule::MicrobatchSplit { local, size });
        }
    }
    if flag(job, p, "enable_async_tensor_parallel") && !flag(job, "compile", "enable") {
        return Err(MeshRule::AsyncTpWithoutCompile);
    }
    Ok(())
}

/// Megatron-LM's arguments, as (flag, value) pairs, for `dp` data-parallel replicas.
pub fn megatron(args: &[(String, Option<String>)], dp: u64) -> Result<(), MeshRule> {
    let get = |name: &str| {
        args.iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_ref())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let has = |name: &str| args.iter().any(|(k, _)| k == name);
    let tp = get("--tensor-model-parallel-size").unwrap_or(1);
    if has("--sequence-parallel") && tp == 1 {
        return Err(MeshRule::SequenceParallelWithoutTp);
    }
    if has("--tp-comm-overlap") && !has("--sequence-parallel") {
        return Err(MeshRule::TpCommOverlapWithoutSp);
    }
    let micro = get("--micro-batch-size").unwrap_or(1);
    let global = get("--global-batch-size").unwrap_or(micro * dp);
    if micro == 0 || !global.is_multiple_of(micro * dp) {
        return Err(MeshRule::GlobalBatchSplit { global, micro, dp });
    }
    let layers = get("--num-layers").unwrap_or(0);
    let pp = get("--pipeline-model-parallel-size").unwrap_or(1);
    let per_chunk = get("--num-layers-per-virtual-pipeline-stage").unwrap_or(layers / pp.max(1));
    let first = get("--decoder-first-pipeline-num-layers");
    let last = get("--decoder-last-pipeline-num-layers");
    let split_ok = if let (Some(first), Some(last)) = (first, last) {
        // The uneven split: the layers left after the first and last stage divide evenly over
        // the others ("With uneven pipelineing the left over layers must be divisible by left
        // over stages", megatron/core/transformer/transformer_block.py).
        pp >= 2
            && layers > first + last
            && (pp == 2 || (layers - first - last).is_multiple_of(pp - 2))
    } else {
        pp > 0
            && layers.is_multiple_of(pp)
            && per_chunk > 0
            && (layers / pp).is_multiple_of(per_chunk)
    };
    if !split_ok {
        return Err(MeshRule::LayerSplit {
            layers,
            pp,
            per_chunk,
        });
    }
    Ok(())
}
