//! Megatron-LM's own memory estimator (NVIDIA/Megatron-LM `megatron/training/theoretical_memory_usage.py`,
//! functions `compute_weight_and_optimizer_memory` and `compute_activation_memory`, the branch for
//! sequence parallelism with selective recompute) re-derived here from its formulas and set beside
//! headroom's mesh memory model. Each difference is asserted to equal its explanation:
//!
//! 1. Norms: the estimator divides every parameter by tp; the norms' weights are replicated on
//!    every tp rank, so headroom counts them whole: + (L/p)·2·norm·h·(1 − 1/t) parameters.
//! 2. The final norm: the estimator spreads it over every stage as block/p; it lives on the last
//!    stage only, so stage 0 has norm·h/(p·t) parameters fewer.
//! 3. Token ids: the estimator divides the embedding's 8sb-byte int64 input by tp; every tp rank
//!    holds the whole input: + 8sb·k·(1 − 1/t) for the k micro-batches stage 0 holds.
//! 4. SwiGLU: the estimator's 4sbf per layer is the GELU MLP's; Megatron's fused SwiGLU keeps
//!    the first linear's 2f-wide output and the second's f-wide input, 6sbf: + 2sbf/t per layer
//!    held.
//! 5. Interleaving: the estimator scales the embedding's p in-flight micro-batches by the
//!    interleaving penalty 1 + (p − 1)/(p·v); replaying the schedule, stage 0 holds
//!    (v + 1)p − 1 chunk-micro-batches at its peak, and at the heaviest such moment (after the
//!    second steady-state forward) 2p of them are of its first chunk (the one with the
//!    embedding), not p·(1 + (p − 1)/(p·v)).

use headroom_plan::mesh::{MeshFramework, MeshModel, Recompute, mesh_memory};
use headroom_plan::strategy::{Mesh, PipelineSchedule, ZeroStage};

/// The estimator's inputs, in its argument names.
struct Args {
    hidden_size: f64,
    num_attention_heads: f64,
    num_query_groups: f64,
    num_layers: f64,
    ffn_hidden_size: f64,
    swiglu: bool,
    /// 1 for RMSNorm, 2 for LayerNorm.
    norm_size: f64,
    padded_vocab_size: f64,
    untie_embeddings_and_output_weights: bool,
    seq_length: f64,
    micro_batch_size: f64,
    tensor_model_parallel_size: f64,
    pipeline_model_parallel_size: f64,
    virtual_pipeline_model_parallel_size: Option<f64>,
    data_parallel_size: f64,
    use_distributed_optimizer: bool,
    num_microbatches: f64,
}

/// `compute_weight_and_optimizer_memory`, dense model, kv_channels·heads = hidden.
fn megatron_weights(a: &Args) -> (f64, f64) {
    let h = a.hidden_size;
    let gated = if a.swiglu { 1.5 } else { 1.0 };
    let self_attn = 2.0 * h * h * (1.0 + a.num_query_groups / a.num_attention_heads);
    let layer = 2.0 * h * (a.ffn_hidden_size * gated + a.norm_size) + self_attn;
    let embedding = h * a.padded_vocab_size;
    let block = layer * a.num_layers + a.norm_size * h;
    let mut most_loaded =
        (block / a.pipeline_model_parallel_size + embedding) / a.tensor_model_parallel_size;
    if a.untie_embeddings_and_output_weights && a.pipeline_model_parallel_size == 1.0 {
        most_loaded += embedding / a.tensor_model_parallel_size;
    }
    let bytes = if a.use_distributed_optimizer {
        6.0 + 12.0 / a.data_parallel_size
    } else {
        18.0
    };
    (most_loaded, most_loaded * bytes)
}

/// `compute_activation_memory` (sequence parallel, selective recompute): stage 0.
fn megatron_activations(a: &Args) -> f64 {
    let (s, b, h, p) = (
        a.seq_length,
        a.micro_batch_size,
        a.hidden_size,
        a.pipeline_model_parallel_size,
    );
    let mut act = s * b * h * (18.0 + 4.0 * a.ffn_hidden_size / h) * a.num_layers;
    act += 8.0 * s * b * p + s * b * h * p;
    match a.virtual_pipeline_model_parallel_size {
        Some(v) => act *= 1.0 + (p - 1.0) / (p * v),
        None if p > 1.0 => act *= (a.num_microbatches / p).min(1.0),
        None => {}
    }
    if p == 1.0 {
        act += s * b * h * 4.0 * (1.0 + a.padded_vocab_size / h);
    }
    act / a.tensor_model_parallel_size
}

fn headroom_model(a: &Args) -> MeshModel {
    MeshModel {
        seq: a.seq_length as u64,
        micro_batch: a.micro_batch_size as u64,
        hidden: a.hidden_size as u64,
        heads: a.num_attention_heads as u64,
        kv_heads: a.num_query_groups as u64,
        layers: a.num_layers as u64,
        vocab: a.padded_vocab_size as u64,
        ffn: a.ffn_hidden_size as u64,
        gated: a.swiglu,
        norm_params: a.norm_size as u64,
        tied_embeddings: !a.untie_embeddings_and_output_weights,
        moe: None,
    }
}

fn headroom_mesh(a: &Args) -> Mesh {
    Mesh {
        dp: a.data_parallel_size as u64,
        tp: a.tensor_model_parallel_size as u64,
        sequence_parallel: true,
        pp: a.pipeline_model_parallel_size as u64,
        schedule: match a.virtual_pipeline_model_parallel_size {
            Some(v) => PipelineSchedule::Interleaved { chunks: v as u64 },
            None => PipelineSchedule::OneFOneB,
        },
        microbatches: a.num_microbatches as u64,
        ..Mesh::default()
    }
}

fn zero(a: &Args) -> ZeroStage {
    ZeroStage::new(u8::from(a.use_distributed_optimizer)).unwrap()
}

fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
        "{what}: headroom {got}, Megatron-LM's estimator plus the explained differences {want}"
    );
}

/// GPT-3 175B (Brown et al. 2020) as in Korthikanti et al. 2022, Table 3: h 12288, 96 heads,
/// 96 layers, s 2048, t 8, p 8, b 1, SP with selective recompute; GPT's vocabulary 50257 padded
/// to 51200 (a multiple of 128·t), tied embeddings, 18 bytes per parameter (no distributed
/// optimizer), 1F1B with 64 micro-batches.
fn gpt3_175b() -> Args {
    Args {
        hidden_size: 12288.0,
        num_attention_heads: 96.0,
        num_query_groups: 96.0,
        num_layers: 96.0,
        ffn_hidden_size: 4.0 * 12288.0,
        swiglu: false,
        norm_size: 2.0,
        padded_vocab_size: 51200.0,
        untie_embeddings_and_output_weights: false,
        seq_length: 2048.0,
        micro_batch_size: 1.0,
        tensor_model_parallel_size: 8.0,
        pipeline_model_parallel_size: 8.0,
        virtual_pipeline_model_parallel_size: None,
        data_parallel_size: 1.0,
        use_distributed_optimizer: false,
        num_microbatches: 64.0,
    }
}

/// Llama-2 70B (Touvron et al. 2023): h 8192, 64 heads, 8 KV heads, 80 layers, SwiGLU with
/// f 28672, RMSNorm, untied, V 32000, s 4096; t 8, p 4 interleaved with v 2, dp 8 with the
/// distributed optimizer, 32 micro-batches of 1.
fn llama2_70b() -> Args {
    Args {
        hidden_size: 8192.0,
        num_attention_heads: 64.0,
        num_query_groups: 8.0,
        num_layers: 80.0,
        ffn_hidden_size: 28672.0,
        swiglu: true,
        norm_size: 1.0,
        padded_vocab_size: 32000.0,
        untie_embeddings_and_output_weights: true,
        seq_length: 4096.0,
        micro_batch_size: 1.0,
        tensor_model_parallel_size: 8.0,
        pipeline_model_parallel_size: 4.0,
        virtual_pipeline_model_parallel_size: Some(2.0),
        data_parallel_size: 8.0,
        use_distributed_optimizer: true,
        num_microbatches: 32.0,
    }
}

#[test]
fn gpt3_175b_tp8_pp8_matches_megatron_up_to_norms_and_token_ids() {
    let a = gpt3_175b();
    let (h, t, p, s, b) = (12288.0, 8.0, 8.0, 2048.0, 1.0);
    let m = mesh_memory(
        &headroom_model(&a),
        &headroom_mesh(&a),
        MeshFramework::Megatron,
        zero(&a),
        Recompute::Selective,
    );
    // Stage 0 holds min(p, m) = 8 micro-batches' activations: far above the last stage's one.
    assert_eq!(m.peak_stage, 0);
    let stage0 = m.peak();

    let (params, states) = megatron_weights(&a);
    // By hand: a layer 2h(4h + 2) + 4h² = 12h² + 4h = 1,811,988,480; 96 of them plus the final
    // norm 2h: 173,950,918,656; /p + V·h = 22,373,010,432; /t = 2,796,626,304 parameters.
    assert_eq!(params, 2_796_626_304.0);
    // Differences 1 and 2: 12 layers · 4h · 7/8 = 516,096 more, 2h/(p·t) = 384 fewer.
    let norms = 12.0 * 4.0 * h * (1.0 - 1.0 / t) - 2.0 * h / (p * t);
    assert_eq!(norms, 515_712.0);
    close(
        stage0.parameters,
        params + norms,
        "GPT-3 parameters on stage 0",
    );
    close(
        stage0.model_states,
        states + 18.0 * norms,
        "GPT-3 model states",
    );

    // The estimator's activations by hand: 96 · 34sbh = 82,141,249,536, + 8sbp + sbhp
    // = 131,072 + 201,326,592, · min(1, 64/8), / t = 10,292,838,400 bytes.
    let act = megatron_activations(&a);
    assert_eq!(act, 10_292_838_400.0);
    // Difference 3: 8sb · 8 micro-batches · 7/8 = 114,688 bytes.
    let token_ids = 8.0 * s * b * 8.0 * (1.0 - 1.0 / t);
    close(
        stage0.activations,
        act + token_ids,
        "GPT-3 activations on stage 0",
    );
}

#[test]
fn llama2_70b_interleaved_matches_megatron_up_to_swiglu_norms_and_the_replayed_schedule() {
    let a = llama2_70b();
    let (h, t, p, s, b, f) = (8192.0, 8.0, 4.0, 4096.0, 1.0, 28672.0);
    let m = mesh_memory(
        &headroom_model(&a),
        &headroom_mesh(&a),
        MeshFramework::Megatron,
        zero(&a),
        Recompute::Selective,
    );
    assert_eq!(m.peak_stage, 0);
    let stage0 = m.peak();

    let (params, states) = megatron_weights(&a);
    // Differences 1 and 2 with RMSNorm (one weight per unit): 20 layers · 2h · 7/8, less
    // h/(p·t).
    let norms = 20.0 * 2.0 * h * (1.0 - 1.0 / t) - h / (p * t);
    close(
        stage0.parameters,
        params + norms,
        "Llama-2 parameters on stage 0",
    );
    // 7.5 bytes per parameter with the distributed optimizer over dp 8.
    close(
        stage0.model_states,
        states + 7.5 * norms,
        "Llama-2 model states",
    );

    let act = megatron_activations(&a);
    // Stage 0 holds (v + 1)p − 1 = 11 chunks of L/(p·v) = 10 layers: 110 = 80·(1 + 3/8), the
    // estimator's penalty, so the layer terms agree but for SwiGLU (difference 4).
    let swiglu = 110.0 * 2.0 * s * b * f / t;
    // Difference 5 (with 3): the estimator charges the embedding (8sb + sbh)·p·(11/8)/t. The
    // replay (p 4, v 2): 10 warm-up forwards leave 6 of chunk 0 and 4 of chunk 1; the first
    // steady forward (chunk 0) makes (7, 4), the first backward (chunk 1) (7, 3), the second
    // forward (chunk 0) (8, 3): 11 again, with one more micro-batch of chunk 0 and so heavier.
    // 2p = 8 micro-batches of chunk 0, each with 8sb + sbh/t.
    let embedding =
        8.0 * (8.0 * s * b + s * b * h / t) - (8.0 * s * b + s * b * h) * p * (11.0 / 8.0) / t;
    close(
        stage0.activations,
        act + swiglu + embedding,
        "Llama-2 activations on stage 0",
    );
}
