//! Megatron-LM's arguments for `pretrain_gpt.py` that run the plan, one per line (`#` lines are
//! comments): the model's dimensions in Megatron-Core's names, the parallel layout
//! (`--tensor-model-parallel-size`, `--sequence-parallel`, `--pipeline-model-parallel-size`,
//! `--num-layers-per-virtual-pipeline-stage`), the batch split, the ZeRO stage across dp and
//! the recompute policy. Names as in Megatron-LM's `examples/llama/train_llama3_8b_h100_fp8.sh`,
//! `examples/gpt3/train_gpt3_175b_distributed.sh` and `examples/megatron_fsdp/`.
//!
//! How each plan lever maps, and what is refused with the reason:
//! - ZeRO-1 is the distributed optimizer (`--use-distributed-optimizer`); ZeRO-2 and ZeRO-3 are
//!   Megatron-FSDP (`--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads` or
//!   `optim_grads_params`, docs/user-guide/features/megatron_fsdp.md), whose documented
//!   combinations are with tensor, context and expert parallelism: with a pipeline, refused
//!   (pin --zero 0 or 1).
//! - Full recompute of every layer is `--recompute-granularity full --recompute-method uniform
//!   --recompute-num-layers 1`; one layer in k is `--recompute-method block` with
//!   `--recompute-num-layers` = the chunk's layers / k (the same count of recomputed layers);
//!   per-op selective recompute has no Megatron-LM form: refused.
//! - Llama, Mistral and Qwen2 (RMSNorm, SwiGLU, rotary positions, no biases but Qwen2's q/k/v
//!   ones) and GPT-2 (LayerNorm, GELU, learned positions, biases) are written; other families
//!   are refused.
//!
//! Not for: the tokenizer, data, learning-rate schedule and checkpoint arguments, which the plan
//! does not decide (a comment names them); Megatron pads the vocabulary to a multiple of
//! 128 × tp (`--make-vocab-size-divisible-by`), a few MB the comment states.

use super::hold_to_rules;
use super::mesh_rules;
use super::mesh_run::{MeshRun, Recompute};
use crate::cost::Problem;
use crate::error::{PlanError, Result};
use crate::model::{Architecture, Family};
use crate::strategy::PipelineSchedule;

const FORMAT: &str = "megatron";

fn refuse(reason: String) -> PlanError {
    PlanError::Export {
        format: FORMAT.into(),
        reason,
    }
}

type Args = Vec<(String, Option<String>)>;

fn push(args: &mut Args, name: &str, value: impl ToString) {
    args.push((name.into(), Some(value.to_string())));
}

fn switch(args: &mut Args, name: &str) {
    args.push((name.into(), None));
}

/// The model's dimensions as Megatron-Core's GPT model takes them.
fn model_args(spec: &Architecture, seq_len: u64, args: &mut Args) -> Result<()> {
    let llama_like = matches!(
        spec.family,
        Family::Llama | Family::Mistral | Family::Qwen2 | Family::Mixtral
    );
    if !llama_like && spec.family != Family::Gpt2 {
        return Err(refuse(format!(
            "the export writes Megatron-Core GPT models of the Llama (Llama, Mistral, Qwen2, Mixtral) and GPT-2 kinds; {} is a {:?} model",
            spec.name, spec.family
        )));
    }
    switch(args, "--use-mcore-models");
    push(args, "--num-layers", spec.num_layers);
    push(args, "--hidden-size", spec.hidden_size);
    push(args, "--ffn-hidden-size", spec.intermediate_size);
    push(args, "--num-attention-heads", spec.num_heads);
    if spec.num_kv_heads != spec.num_heads {
        switch(args, "--group-query-attention");
        push(args, "--num-query-groups", spec.num_kv_heads);
    }
    push(args, "--kv-channels", spec.head_dim);
    push(args, "--seq-length", seq_len);
    let positions = if llama_like {
        seq_len
    } else {
        spec.max_learned_positions.unwrap_or(seq_len)
    };
    push(args, "--max-position-embeddings", positions);
    push(args, "--attention-dropout", "0.0");
    push(args, "--hidden-dropout", "0.0");
    if llama_like {
        push(args, "--position-embedding-type", "rope");
        push(args, "--normalization", "RMSNorm");
        switch(args, "--swiglu");
        switch(args, "--disable-bias-linear");
        if spec.family == Family::Qwen2 {
            switch(args, "--add-qkv-bias");
        }
    } else {
        push(args, "--position-embedding-type", "learned_absolute");
        push(args, "--normalization", "LayerNorm");
    }
    if !spec.tie_word_embeddings {
        switch(args, "--untie-embeddings-and-output-weights");
    }
    if spec.num_experts > 1 {
        // Megatron-Core's MoE (megatron/core/transformer/moe/README.md, "Quick Start"): the
        // experts, the router's top-k and the all-to-all token dispatcher the plan's expert
        // parallelism exchanges tokens with.
        push(args, "--num-experts", spec.num_experts);
        push(args, "--moe-router-topk", spec.experts_per_token);
        push(args, "--moe-token-dispatcher-type", "alltoall");
    }
    push(args, "--attention-backend", "flash");
    Ok(())
}

fn parallel_args(run: &MeshRun, layers: u64, args: &mut Args) -> Result<()> {
    let m = &run.mesh;
    push(args, "--tensor-model-parallel-size", m.tp);
    if m.sequence_parallel {
        switch(args, "--sequence-parallel");
    }
    if m.tp_comm_overlap {
        // Megatron-Core's userbuffer overlap of TP's all-gathers and reduce-scatters with the
        // GEMMs (Transformer Engine), `ModelParallelConfig.tp_comm_overlap`.
        switch(args, "--tp-comm-overlap");
    }
    push(args, "--pipeline-model-parallel-size", m.pp);
    if m.cp > 1 {
        // `ModelParallelConfig.context_parallel_size` (megatron/core/model_parallel_config.py).
        push(args, "--context-parallel-size", m.cp);
    }
    if m.ep > 1 {
        push(args, "--expert-model-parallel-size", m.ep);
    }
    let k = m.fewer_layers_at_ends;
    let per_chunk = (layers + 2 * k) / m.virtual_stages();
    if k > 0 {
        // Megatron-LM's uneven split names the first and last pipeline stage's layers, and
        // spreads a stage's layers evenly over its chunks
        // (`megatron/core/transformer/transformer_block.py`, `get_num_layers_to_build`): with
        // interleaving that takes layers off every chunk of the end stages, not off the first
        // and last chunk as the plan does.
        if let PipelineSchedule::Interleaved { chunks } = m.schedule {
            return Err(refuse(format!(
                "the plan takes {k} layer off the first and last of {} model chunks, and Megatron-LM's uneven split (--decoder-first-pipeline-num-layers) takes layers off every chunk of the first and last stage; pin --pp-schedule 1f1b, or a pp and chunk count whose product divides {layers}",
                m.pp * chunks
            )));
        }
        push(args, "--decoder-first-pipeline-num-layers", per_chunk - k);
        push(args, "--decoder-last-pipeline-num-layers", per_chunk - k);
    } else if let PipelineSchedule::Interleaved { .. } = m.schedule {
        push(args, "--num-layers-per-virtual-pipeline-stage", per_chunk);
    }
    match run.zero_stage.number() {
        0 => {}
        1 => switch(args, "--use-distributed-optimizer"),
        stage if m.pp > 1 => {
            return Err(refuse(format!(
                "ZeRO-{stage} is Megatron-FSDP here, whose documented combinations are with tensor, context and expert parallelism, not a pipeline; pin --zero 1 (the distributed optimizer) or 0"
            )));
        }
        stage => {
            switch(args, "--use-megatron-fsdp");
            let strategy = if stage == 3 {
                "optim_grads_params"
            } else {
                "optim_grads"
            };
            push(args, "--data-parallel-sharding-strategy", strategy);
        }
    }
    push(args, "--micro-batch-size", run.micro_batch);
    push(args, "--global-batch-size", run.global_batch());
    match run.recompute {
        Recompute::Nothing => {}
        Recompute::EveryNth(k) if per_chunk.is_multiple_of(k) => {
            push(args, "--recompute-granularity", "full");
            if k == 1 {
                push(args, "--recompute-method", "uniform");
                push(args, "--recompute-num-layers", 1);
            } else {
                push(args, "--recompute-method", "block");
                push(args, "--recompute-num-layers", per_chunk / k);
            }
        }
        Recompute::EveryNth(k) => {
            return Err(refuse(format!(
                "checkpointing one layer in {k} needs the {per_chunk} layers of each model chunk to divide by {k} (Megatron-LM's block recompute counts layers per chunk); pin --checkpoint all or every:K with K dividing {per_chunk}"
            )));
        }
        Recompute::SelectiveOp => {
            return Err(refuse(
                "per-op selective recompute is torchtitan's; Megatron-LM recomputes whole layers (--recompute-granularity full) or the attention core (selective, which flash attention makes free); pin --checkpoint all or none".into(),
            ));
        }
    }
    switch(args, "--bf16");
    push(args, "--optimizer", "adam");
    Ok(())
}

/// Builds the arguments file of `run` for `problem`'s model.
pub fn megatron_args(problem: &Problem, run: &MeshRun) -> Result<String> {
    let spec = &problem.spec;
    let mut args = Args::new();
    model_args(spec, run.seq_len, &mut args)?;
    parallel_args(run, spec.num_layers, &mut args)?;
    hold_to_rules(FORMAT, mesh_rules::megatron(&args, run.mesh.dp))?;
    let padded = spec
        .vocab_size
        .div_ceil(128 * run.mesh.tp)
        .saturating_mul(128 * run.mesh.tp);
    let mut text = format!(
        "# Megatron-LM arguments written by `headroom plan --emit megatron` for {} ({} GPUs: dp {} × tp {} × pp {}).\n\
         # Run: torchrun --nproc_per_node <GPUs per node> --nnodes <nodes> pretrain_gpt.py $(grep -v '^#' THIS_FILE) \\\n\
         #   plus the tokenizer (vocabulary {} padded to {} for tp {}), --data-path, --lr and the save/load arguments.\n",
        spec.name,
        run.mesh.world_size(),
        run.mesh.dp,
        run.mesh.tp,
        run.mesh.pp,
        spec.vocab_size,
        padded,
        run.mesh.tp
    );
    for (name, value) in &args {
        text += name;
        if let Some(v) = value {
            text += " ";
            text += v;
        }
        text += "\n";
    }
    Ok(text)
}
