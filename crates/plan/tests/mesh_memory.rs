//! Memory per pipeline stage and rank on a tensor × pipeline × data mesh: small cases derived by
//! hand from Korthikanti et al. 2022 (arXiv:2205.05198) and the 1F1B / interleaved schedules
//! (Narayanan et al. 2021, arXiv:2104.04473).

use headroom_plan::mesh::{MeshFramework, MeshModel, Recompute, mesh_memory};
use headroom_plan::strategy::{Mesh, PipelineSchedule, ZeroStage};

/// s = 8, b = 2, h = 16, a = 4, L = 4, V = 64, f = 4h = 64, LayerNorm, tied embeddings:
/// sbh = 256, sb = 16.
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

/// tp 2 with SP, pp 2, dp 2.
fn mesh(schedule: PipelineSchedule, microbatches: u64) -> Mesh {
    Mesh {
        dp: 2,
        tp: 2,
        sequence_parallel: true,
        pp: 2,
        schedule,
        microbatches,
        ..Mesh::default()
    }
}

fn zero1() -> ZeroStage {
    ZeroStage::new(1).unwrap()
}

// Shared by every case below (tp 2, SP, selective recompute, ZeRO-1 over dp 2):
// - one layer's activations: 34sbh/t = 34·256/2 = 4352 bytes;
// - one layer's parameters on a rank: 12h²/t + two LayerNorms 4h = 1536 + 64 = 1600;
// - the embedding V·h/t = 1024/2 = 512 (on stage 0, and its tied copy on the last stage);
// - bytes per parameter, distributed optimizer: 6 + 12/dp = 12.
// Stage 0 parameters: 2 layers · 1600 + 512 = 3712 → 44,544 bytes.
// Stage 1 parameters: 2 · 1600 + final norm 2h = 32 + tied copy 512 = 3744 → 44,928 bytes.
// Stage 0's embedding per micro-batch: token ids 8sb = 128 + dropout mask sbh/t = 128 = 256.
// Stage 1's output layer and loss per micro-batch: 4sbh/t + 4sbV/t = 512 + 2048 = 2560.

#[test]
fn one_f_one_b_stages_hold_p_minus_i_micro_batches_and_stage_0_peaks() {
    let mesh = mesh(PipelineSchedule::OneFOneB, 4);
    let m = mesh_memory(
        &tiny(),
        &mesh,
        MeshFramework::Megatron,
        zero1(),
        Recompute::Selective,
    );
    let (s0, s1) = (&m.stages[0], &m.stages[1]);
    assert_eq!(s0.parameters, 3712.0);
    assert_eq!(s0.model_states, 44_544.0);
    // min(p − 0, m) = 2 micro-batches × 2 layers × 4352 + 2 × 256.
    assert_eq!(s0.activations, 17_408.0 + 512.0);
    assert_eq!(s1.parameters, 3744.0);
    assert_eq!(s1.model_states, 44_928.0);
    // min(p − 1, m) = 1 micro-batch × 2 layers × 4352 + 2560.
    assert_eq!(s1.activations, 8704.0 + 2560.0);
    // 62,464 > 56,192.
    assert_eq!(m.peak_stage, 0);
    assert_eq!(m.peak().total(), 62_464.0);
    assert_eq!(m.peak_rank, 0);
    assert!(
        m.describe_peak(&mesh)
            .contains("pipeline stage 0 of 2 (ranks 0–1")
    );
}

#[test]
fn with_one_micro_batch_the_loss_puts_the_peak_on_the_last_stage() {
    // m = 1: stage 0 holds one micro-batch too: 8704 + 256 = 8960, total 53,504, below stage
    // 1's 56,192. Stage 1's first rank is 1·dp·cp·tp = 4.
    let mesh = mesh(PipelineSchedule::OneFOneB, 1);
    let m = mesh_memory(
        &tiny(),
        &mesh,
        MeshFramework::Megatron,
        zero1(),
        Recompute::Selective,
    );
    assert_eq!(m.stages[0].activations, 8960.0);
    assert_eq!(m.peak_stage, 1);
    assert_eq!(m.peak().total(), 56_192.0);
    assert_eq!(m.peak_rank, 4);
    assert!(m.describe_peak(&mesh).contains("ranks 4–5"));
}

#[test]
fn interleaving_holds_more_on_stage_0_and_follows_the_replayed_schedule() {
    // v = 2: 4 layers in p·v = 4 chunks of one layer. Stage 0 runs 2(p − 1) + (v − 1)p = 4
    // warm-up forwards (chunk 0 of micro-batches 0–1, chunk 1 of 0–1), then chunk 0 of
    // micro-batch 2: 3 of chunk 0 and 2 of chunk 1, 5 = (v + 1)p − 1 chunk-micro-batches; the
    // first backward (chunk 1) leaves (3, 1) and chunk 0 of micro-batch 3 makes (4, 1): 5 again,
    // heavier by one more micro-batch of chunk 0's embedding bytes, so the peak.
    // Stage 1 runs 2 warm-up forwards (chunk 0 of 0–1), then chunk 1 of micro-batch 0: 3.
    let mesh = mesh(PipelineSchedule::Interleaved { chunks: 2 }, 4);
    let m = mesh_memory(
        &tiny(),
        &mesh,
        MeshFramework::Megatron,
        zero1(),
        Recompute::Selective,
    );
    // 5 × 4352 + 4 (chunk 0, which holds the embedding) × 256.
    assert_eq!(m.stages[0].activations, 21_760.0 + 1024.0);
    // 3 × 4352 + 1 (chunk 1, which holds the loss) × 2560.
    assert_eq!(m.stages[1].activations, 13_056.0 + 2560.0);
    // The model states do not depend on the schedule.
    assert_eq!(m.stages[0].model_states, 44_544.0);
}

#[test]
fn the_zero_stage_shards_model_states_across_dp() {
    let mesh = mesh(PipelineSchedule::OneFOneB, 4);
    // 3712 parameters on stage 0: 18 B each without sharding, 2 + 16/2 = 10 at ZeRO-2 and
    // 18/2 = 9 at ZeRO-3.
    for (stage, bytes) in [(0, 18.0), (2, 10.0), (3, 9.0)] {
        let m = mesh_memory(
            &tiny(),
            &mesh,
            MeshFramework::Megatron,
            ZeroStage::new(stage).unwrap(),
            Recompute::Selective,
        );
        assert_eq!(m.stages[0].model_states, 3712.0 * bytes, "ZeRO-{stage}");
    }
}

#[test]
fn without_a_mesh_the_layer_terms_are_korthikantis_unsplit_ones() {
    // tp 1, pp 1, m 1, no recompute: 4 layers × sbh(34 + 5as/h) = 4 × 11,264, the embedding
    // (128 + 256) and the loss 4sbh + 4sbV = 1024 + 4096; with tied weights the single stage holds the
    // embedding once: 4 × (12h² + 4h) + V·h + 2h = 12,544 + 1024 + 32 parameters.
    let m = mesh_memory(
        &tiny(),
        &Mesh::default(),
        MeshFramework::Megatron,
        ZeroStage::default(),
        Recompute::None,
    );
    assert_eq!(m.stages.len(), 1);
    assert_eq!(m.stages[0].activations, 45_056.0 + 384.0 + 5120.0);
    assert_eq!(m.stages[0].parameters, 13_600.0);
}

#[test]
fn an_uneven_split_gives_the_end_stages_one_layer_fewer() {
    // Llama 3.1 405B on tp 8 × pp 8 with one layer fewer at both ends (15, 16 × 6, 15). Per
    // layer on one tp rank: the matrices 3,187,671,040 / 8 = 398,458,880 plus two norms of
    // 16,384 (not split): 398,491,648. The embedding and the untied output layer 128,256 ·
    // 16,384 / 8 = 262,668,288 each.
    let spec = headroom_plan::model::load_model("llama-3.1-405b").unwrap();
    let model = MeshModel::from_architecture(&spec, 8192, 1).unwrap();
    let mesh = Mesh {
        dp: 8,
        tp: 8,
        sequence_parallel: true,
        pp: 8,
        microbatches: 32,
        fewer_layers_at_ends: 1,
        ..Mesh::default()
    };
    let m = mesh_memory(
        &model,
        &mesh,
        MeshFramework::Megatron,
        ZeroStage::new(3).unwrap(),
        Recompute::Full,
    );
    let params: Vec<f64> = m.stages.iter().map(|s| s.parameters).collect();
    // Stage 0: 15 · 398,491,648 + 262,668,288 = 6,240,043,008.
    assert_eq!(params[0], 6_240_043_008.0);
    // Stages 1–6: 16 · 398,491,648 = 6,375,866,368.
    assert!(params[1..7].iter().all(|p| *p == 6_375_866_368.0));
    // Stage 7: 15 layers, the final norm (16,384) and the output layer: 6,240,059,392.
    assert_eq!(params[7], 6_240_059_392.0);
    // Over the pipeline, every parameter once per tp rank: 126 layers, two vocabulary tables
    // and the final norm.
    let total: f64 = params.iter().sum();
    assert_eq!(
        total,
        126.0 * 398_491_648.0 + 2.0 * 262_668_288.0 + 16_384.0
    );
}
