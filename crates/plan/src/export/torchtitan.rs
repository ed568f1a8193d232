//! A torchtitan job TOML (`torchtitan/models/llama3/train_configs/*.toml` form; keys of
//! `torchtitan/config/job_config.py`, torchtitan v0.2.2) that runs the plan: the model flavor,
//! the batch split, `[parallelism]` (FSDP degree, tensor and pipeline degrees, the schedule and
//! its micro-batch size, the layers per stage), `[activation_checkpoint]` and bf16 mixed
//! precision.
//!
//! How each plan lever maps, and what torchtitan cannot run (refused with the reason):
//! - ZeRO-3 is FSDP2 with `fsdp_reshard_after_forward = "always"`, written explicitly: the
//!   `"default"` policy keeps the gathered parameters after forward when pipelining
//!   (`reshard_after_forward = not pp_enabled`, `torchtitan/models/llama3/infra/parallelize.py`),
//!   which is ZeRO-2's memory. ZeRO-2 is `"never"`. ZeRO-1 (optimizer states alone sharded) has
//!   no FSDP2 form: refused. ZeRO-0 over several GPUs is DDP (`data_parallel_replicate_degree`),
//!   which torchtitan runs only as the one parallelism ("DDP has not supported > 1D
//!   parallelism", same file): refused with tp or pp.
//! - Tensor parallelism always shards the norms' activations (`SequenceParallel` on
//!   `attention_norm`, `ffn_norm` and `norm` in the same file): a plan with tp > 1 and sequence
//!   parallelism off is refused.
//! - The stage split is the plan's: `pipeline_parallel_layers_per_stage` = (L + 2k)/(pp·v) with
//!   the first and last stage's `*_less_layers = k`, the layers the plan takes off both ends
//!   (0 for an even split; torchtitan's own default is 1).
//! - The model is one of torchtitan's llama3 flavors (8B, 70B, 405B,
//!   `torchtitan/models/llama3/__init__.py`), matched on its dimensions; another model is
//!   refused (register a flavor, or use the Megatron-LM export).
//!
//! Not for: the dataset, tokenizer, optimizer hyper-parameters and checkpoint folders, which
//! the plan does not decide (the file keeps torchtitan's defaults for them).

use super::mesh_run::{MeshRun, Recompute};
use super::{hold_to_rules, mesh_rules};
use crate::cost::Problem;
use crate::error::{PlanError, Result};
use crate::model::{Architecture, Family};
use crate::strategy::{OptimizerImpl, PipelineSchedule};
use toml::{Table, Value};

const FORMAT: &str = "torchtitan";

fn refuse(reason: String) -> PlanError {
    PlanError::Export {
        format: FORMAT.into(),
        reason,
    }
}

/// torchtitan's llama3 flavor with the model's dimensions: (flavor, dim, layers, heads, KV
/// heads, FFN width, vocabulary). The FFN widths follow from `ffn_dim_multiplier` and
/// `multiple_of` in the flavors' arguments (1.3 and 1024 → 14,336; 1.3 and 4096 → 28,672; 1.2
/// and 4096 → 53,248), the vocabulary is `TransformerModelArgs.vocab_size`'s default, 128,256.
const FLAVORS: [(&str, u64, u64, u64, u64, u64, u64); 3] = [
    ("8B", 4096, 32, 32, 8, 14_336, 128_256),
    ("70B", 8192, 80, 64, 8, 28_672, 128_256),
    ("405B", 16_384, 126, 128, 8, 53_248, 128_256),
];

fn flavor(spec: &Architecture) -> Result<&'static str> {
    let dims = (
        spec.hidden_size,
        spec.num_layers,
        spec.num_heads,
        spec.num_kv_heads,
        spec.intermediate_size,
        spec.vocab_size,
    );
    FLAVORS
        .iter()
        .find(|f| spec.family == Family::Llama && (f.1, f.2, f.3, f.4, f.5, f.6) == dims)
        .map(|f| f.0)
        .ok_or_else(|| {
            refuse(format!(
                "torchtitan's llama3 model has the flavors 8B, 70B and 405B (torchtitan/models/llama3/__init__.py), and {} (hidden {}, {} layers, {} heads over {} KV heads, FFN {}, vocabulary {}) is none of them; register a flavor with these dimensions, or use --emit megatron",
                spec.name,
                dims.0,
                dims.1,
                dims.2,
                dims.3,
                dims.4,
                dims.5
            ))
        })
}

fn table(entries: Vec<(&str, Value)>) -> Value {
    Value::Table(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

fn int(v: u64) -> Value {
    Value::Integer(v as i64)
}

fn text(v: &str) -> Value {
    Value::String(v.into())
}

/// The `[parallelism]` section, after refusing what torchtitan cannot run.
fn parallelism(run: &MeshRun, layers: u64, compile: bool) -> Result<Value> {
    let m = &run.mesh;
    let mut p = vec![("tensor_parallel_degree", int(m.tp))];
    if m.tp > 1 && !m.sequence_parallel {
        return Err(refuse(
            "torchtitan's tensor parallelism always shards the norms' activations across the tp ranks (SequenceParallel on the norms, torchtitan/models/llama3/infra/parallelize.py); pin --sequence-parallel on".into(),
        ));
    }
    match run.zero_stage.number() {
        0 if m.dp > 1 && (m.tp > 1 || m.pp > 1) => {
            return Err(refuse(
                "without sharding, data parallelism is torchtitan's DDP, which it runs only as the one parallelism (\"DDP has not supported > 1D parallelism\"); pin --zero 2 or 3".into(),
            ));
        }
        0 => {
            p.push(("data_parallel_replicate_degree", int(m.dp)));
            p.push(("data_parallel_shard_degree", int(1)));
        }
        1 => {
            return Err(refuse(
                "ZeRO-1 shards only the optimizer states, and torchtitan's FSDP2 shards parameters and gradients with them; pin --zero 2 (fsdp_reshard_after_forward = \"never\") or 3, or use --emit megatron (its distributed optimizer)".into(),
            ));
        }
        stage => {
            p.push(("data_parallel_replicate_degree", int(1)));
            p.push(("data_parallel_shard_degree", int(m.dp)));
            let policy = if stage == 3 { "always" } else { "never" };
            p.push(("fsdp_reshard_after_forward", text(policy)));
        }
    }
    p.push(("pipeline_parallel_degree", int(m.pp)));
    if m.pp > 1 {
        let schedule = match m.schedule {
            PipelineSchedule::OneFOneB => "1F1B",
            PipelineSchedule::Interleaved { .. } => "Interleaved1F1B",
        };
        p.push(("pipeline_parallel_schedule", text(schedule)));
        p.push(("pipeline_parallel_microbatch_size", int(run.micro_batch)));
        let k = m.fewer_layers_at_ends;
        p.push((
            "pipeline_parallel_layers_per_stage",
            int((layers + 2 * k) / m.virtual_stages()),
        ));
        p.push(("pipeline_parallel_first_stage_less_layers", int(k)));
        p.push(("pipeline_parallel_last_stage_less_layers", int(k)));
    }
    p.push(("context_parallel_degree", int(m.cp)));
    if m.tp_comm_overlap && !compile {
        return Err(refuse(
            "torchtitan's async tensor parallelism runs only in a compiled model (\"Async TP requires 'model' in --compile.components and --compile.enable\", torchtitan/distributed/tensor_parallel.py); add --compile, or use --emit megatron (--tp-comm-overlap)".into(),
        ));
    }
    p.push((
        "enable_async_tensor_parallel",
        Value::Boolean(m.tp_comm_overlap),
    ));
    Ok(table(p))
}

fn activation_checkpoint(run: &MeshRun) -> Value {
    match run.recompute {
        Recompute::Nothing => table(vec![("mode", text("none"))]),
        Recompute::EveryNth(1) => table(vec![("mode", text("full"))]),
        Recompute::EveryNth(k) => table(vec![
            ("mode", text("selective")),
            ("selective_ac_option", text(&k.to_string())),
        ]),
        Recompute::SelectiveOp => table(vec![
            ("mode", text("selective")),
            ("selective_ac_option", text("op")),
        ]),
    }
}

/// Builds the job TOML of `run` for `problem`'s model.
pub fn torchtitan_toml(problem: &Problem, run: &MeshRun) -> Result<String> {
    let flavor = flavor(&problem.spec)?;
    let layers = problem.spec.num_layers;
    let mut job = Table::new();
    job.insert(
        "model".into(),
        table(vec![("name", text("llama3")), ("flavor", text(flavor))]),
    );
    let implementation = match problem.optimizer_impl {
        OptimizerImpl::Foreach => "foreach",
        OptimizerImpl::Fused => "fused",
        OptimizerImpl::PerTensor => "for-loop",
    };
    job.insert(
        "optimizer".into(),
        table(vec![
            ("name", text("AdamW")),
            ("implementation", text(implementation)),
        ]),
    );
    // Without a pipeline, accumulation is global_batch_size over local_batch_size × dp; with
    // one, the local batch is cut into micro-batches of pipeline_parallel_microbatch_size.
    let local = if run.mesh.pp > 1 {
        run.local_batch()
    } else {
        run.micro_batch
    };
    job.insert(
        "training".into(),
        table(vec![
            ("local_batch_size", int(local)),
            ("global_batch_size", int(run.global_batch())),
            ("seq_len", int(run.seq_len)),
            ("dtype", text("float32")),
            ("mixed_precision_param", text("bfloat16")),
            ("mixed_precision_reduce", text("float32")),
        ]),
    );
    job.insert(
        "parallelism".into(),
        parallelism(run, layers, problem.compile)?,
    );
    job.insert("activation_checkpoint".into(), activation_checkpoint(run));
    job.insert(
        "compile".into(),
        table(vec![("enable", Value::Boolean(problem.compile))]),
    );
    hold_to_rules(FORMAT, mesh_rules::torchtitan(&job, layers))?;
    let text = format!(
        "# torchtitan job config written by `headroom plan --emit torchtitan` for {} ({} GPUs: dp {} × tp {} × pp {}).\n# Run: NGPU={} CONFIG_FILE=this.toml ./run_train.sh (torchtitan v0.2.2); set [training] dataset, [model] hf_assets_path and the optimizer's lr for your run.\n{}",
        problem.spec.name,
        run.mesh.world_size(),
        run.mesh.dp,
        run.mesh.tp,
        run.mesh.pp,
        run.mesh.world_size(),
        toml::to_string(&job).expect("a table of strings, integers and booleans serialises")
    );
    Ok(text)
}
