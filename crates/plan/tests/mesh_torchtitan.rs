//! torchtitan's layout on a mesh (`--framework fsdp`), derived by hand beside Megatron-LM's:
//! FSDP2's fp32 parameters as the master copy (16 bytes per parameter sharded across dp), the
//! stage kept gathered with fp32-accumulated gradients under pipeline parallelism, and the
//! loss's gradients on the last stage; context parallelism's sequence shard and its attention
//! over the whole sequence.

use headroom_plan::cost::{CostModel, Problem};
use headroom_plan::hardware;
use headroom_plan::mesh::{
    MeshFramework, MeshModel, MeshPlan, Recompute, bytes_per_parameter, context_attention_bytes,
    cp_bytes_per_layer, evaluate_mesh,
};
use headroom_plan::model::load_model;
use headroom_plan::strategy::{Framework, Mesh, Precision, ZeroStage};
use headroom_plan::workload::{BatchSpec, Workload};

/// Llama 3.1 8B at 1,024 tokens on one node of 8 H100 80GB, 8 sequences per step.
fn problem(framework: Framework) -> Problem {
    let spec = load_model("llama-3.1-8b").unwrap();
    let mut hw = hardware::preset("H100-80GB").unwrap();
    hw.gpus_per_node = 8;
    let workload = Workload::new(&spec, 1024, BatchSpec::Samples(8), None, None, 1).unwrap();
    Problem::new(spec, hw, workload, CostModel::default()).with_framework(framework)
}

fn zero(stage: u8) -> ZeroStage {
    ZeroStage::new(stage).unwrap()
}

/// `mesh` costed for `p` in bf16-mixed, ZeRO-3, full recompute (every plan here).
fn full_zero3(p: &Problem, model: &MeshModel, mesh: &Mesh) -> MeshPlan {
    evaluate_mesh(
        p,
        model,
        mesh,
        Precision::Bf16Mixed,
        zero(3),
        Recompute::Full,
    )
}

// One layer's matrices over tp 2: (2·4096² + 2·4096·1024 + 3·4096·14336)/2 = 109,051,904; its
// two RMSNorms 8,192 (whole). The embedding and the untied output layer: 128,256·4096/2 =
// 262,668,288 each. The recomputed layer under full recompute (Korthikanti's selective bytes
// with SP, b = 1, s = 1024): 81,788,928 (derived in tests/mesh_search.rs).
const LAYER: f64 = 109_051_904.0;
const NORMS: f64 = 8_192.0;
const EMBEDDING: f64 = 262_668_288.0;
const RECOMPUTED: f64 = 81_788_928.0;
// Loss parallel's backward under tp 2: three vocabulary-sized fp32 tensors alive at once (a
// zero-filled gradient, exp of the log-probabilities and their sum, then the sum times the
// output gradient), 12·s·b·V/t = 12·1024·128,256/2.
const LOSS_GRADS: f64 = 788_004_864.0;

#[test]
fn fsdp2_keeps_sixteen_bytes_per_parameter_sharded_as_the_stage_says() {
    let tt = MeshFramework::Torchtitan;
    // fp32 parameter 4 + fp32 gradient 4 + Adam's two fp32 moments 8.
    assert_eq!(bytes_per_parameter(tt, zero(0), 4), 16.0);
    assert_eq!(bytes_per_parameter(tt, zero(1), 4), 8.0 + 2.0);
    assert_eq!(bytes_per_parameter(tt, zero(2), 4), 4.0 + 3.0);
    assert_eq!(bytes_per_parameter(tt, zero(3), 4), 4.0);
    // Megatron-LM: a bf16 weight beside the fp32 master, 18 in all.
    assert_eq!(
        bytes_per_parameter(MeshFramework::Megatron, zero(3), 4),
        4.5
    );
}

#[test]
fn under_pipeline_parallelism_the_stage_stays_gathered_with_fp32_gradient_accumulators() {
    // tp 2 (SP), pp 2, dp 2, 2 micro-batches of 1, ZeRO-3, full recompute: 16 layers a stage.
    let mesh = Mesh {
        dp: 2,
        tp: 2,
        pp: 2,
        sequence_parallel: true,
        microbatches: 2,
        ..Mesh::default()
    };
    let p = problem(Framework::Fsdp);
    let model = MeshModel::from_architecture(&p.spec, 1024, 1).unwrap();
    let plan = full_zero3(&p, &model, &mesh);
    let first = 16.0 * (LAYER + NORMS) + EMBEDDING;
    let last = 16.0 * (LAYER + NORMS) + 4096.0 + EMBEDDING;
    assert_eq!(plan.stages[0].parameters, first);
    assert_eq!(plan.stages[1].parameters, last);
    // States: 16/dp = 8 bytes per parameter.
    assert_eq!(plan.stages[0].model_states_bytes, (8.0 * first) as u64);
    // Buffers: the stage gathered in bf16 (2) and its fp32 accumulated gradients (4), one
    // layer's bf16 gradient before it is added (2 per layer parameter), and the recomputed
    // layer; on the last stage the loss's gradients instead, being larger.
    let want0 = 6.0 * first + 2.0 * LAYER + RECOMPUTED;
    let want1 = 6.0 * last + 2.0 * LAYER + LOSS_GRADS;
    assert_eq!(plan.stages[0].buffer_bytes, want0 as u64);
    assert_eq!(plan.stages[1].buffer_bytes, want1 as u64);

    // Megatron-LM's layout on the same mesh: 18/dp, two layers gathered and one layer's fp32
    // gradients (8 bytes per layer parameter), and the fused loss's gradient written in place.
    let m = problem(Framework::DeepSpeed);
    let plan = full_zero3(&m, &model, &mesh);
    assert_eq!(plan.stages[0].model_states_bytes, (9.0 * first) as u64);
    for stage in &plan.stages {
        assert_eq!(stage.buffer_bytes, (8.0 * LAYER + RECOMPUTED) as u64);
    }
}

#[test]
fn without_pipeline_parallelism_fsdp2_gathers_two_layers_and_the_loss_is_the_larger_buffer() {
    let mesh = Mesh {
        dp: 4,
        tp: 2,
        sequence_parallel: true,
        microbatches: 2,
        ..Mesh::default()
    };
    let p = problem(Framework::Fsdp);
    let model = MeshModel::from_architecture(&p.spec, 1024, 1).unwrap();
    let plan = full_zero3(&p, &model, &mesh);
    assert_eq!(
        plan.stages[0].buffer_bytes,
        (8.0 * LAYER + LOSS_GRADS) as u64
    );
}

#[test]
fn context_parallelism_shards_the_sequence_and_gathers_the_keys_and_values_by_hand() {
    // dp 4 × cp 2 on 8 GPUs, no tp or pp, ZeRO-3, full recompute: each rank holds 512 of the
    // 1,024 tokens. d_kv = 4096 · 8/32 = 1024.
    let mesh = Mesh {
        dp: 4,
        cp: 2,
        ..Mesh::default()
    };
    let p = problem(Framework::Fsdp);
    let model = MeshModel::from_architecture(&p.spec, 1024, 1).unwrap();
    let plan = full_zero3(&p, &model, &mesh);
    let stage = &plan.stages[0];
    // 8,030,261,248 parameters (Llama 3.1 8B), sharded over dp·cp = 8: 16/8 bytes each.
    assert_eq!(stage.parameters, 8_030_261_248.0);
    assert_eq!(stage.model_states_bytes, 2 * 8_030_261_248);
    // Activations at s = 512: 32 layer inputs 2sbh = 4,194,304 each; the token ids 8sb = 4,096
    // and the embedding's mask sbh = 2,097,152; the final norm's and output layer's inputs 4sbh
    // = 8,388,608 and the fp32 logits 4sbV = 262,668,288.
    assert_eq!(
        stage.activation_bytes,
        32 * 4_194_304 + 4_096 + 2_097_152 + 8_388_608 + 262_668_288
    );
    // The attention under CP: keys and values of all 1,024 tokens in bf16, 2·2·1024·1024 =
    // 4,194,304; fp32 gradient accumulators of the local q, k, v, 4·512·(4096 + 2048) =
    // 12,582,912; key and value gradients in flight, 2·2·4·512·1024 = 8,388,608.
    let attention = 25_165_824.0;
    assert_eq!(context_attention_bytes(&model, &mesh), attention);
    // Buffers: two gathered layers and one layer's fp32 gradients (8 · 218,103,808), and the
    // larger of the recomputed layer with its attention (81,788,928 + 25,165,824) and the
    // loss's two fp32 gradients at tp 1 (8sbV = 525,336,576).
    assert_eq!(
        stage.buffer_bytes,
        (8.0 * 218_103_808.0 + (8.0 * 512.0 * 128_256.0_f64).max(RECOMPUTED + attention)) as u64
    );
    // Per layer and micro-batch a rank receives half of the 2·2·1024·1024 gathered bytes three
    // times (forward, recompute, backward) and passes 2·4·512·1024 bytes of gradients on once.
    assert_eq!(
        cp_bytes_per_layer(&model, &mesh, Recompute::Full),
        3.0 * 2_097_152.0 + 4_194_304.0
    );
}
