//! The mesh memory model fed from the planner's own models: its per-shard parameters add up to
//! the planner's independent parameter inventory, the mesh constraints come from the model's
//! shape, and the models it cannot cost are refused with the reason.

use headroom_plan::mesh::{
    MeshFramework, MeshModel, Recompute, candidate_meshes, mesh_memory, mesh_shape,
};
use headroom_plan::model::{ParamInventory, load_model};
use headroom_plan::strategy::{Mesh, PipelineSchedule, ZeroStage};

#[test]
fn the_shards_add_up_to_the_parameter_inventory() {
    // Llama-2 70B (untied, RMSNorm, no linear biases), Llama-3.2 1B (tied).
    for name in ["llama-2-70b", "llama-3.2-1b", "llama-2-7b"] {
        let arch = load_model(name).unwrap();
        let total = ParamInventory::of(&arch).total() as f64;
        let model = MeshModel::from_architecture(&arch, 4096, 1).unwrap();
        let single = mesh_memory(
            &model,
            &Mesh::default(),
            MeshFramework::Megatron,
            ZeroStage::default(),
            Recompute::Full,
        );
        assert_eq!(single.stages[0].parameters, total, "{name} on one device");

        // On t·p ranks: each stage's rank holds 1/t of its matrices and every norm whole, so
        // t · Σ stages = total + (t − 1) · (all norms: 2h per layer + the final h); with tied
        // embeddings the last stage also keeps a copy of V·h/t.
        let mesh = Mesh {
            tp: 4,
            sequence_parallel: true,
            pp: 2,
            microbatches: 8,
            ..Mesh::default()
        };
        let split = mesh_memory(
            &model,
            &mesh,
            MeshFramework::Megatron,
            ZeroStage::default(),
            Recompute::Full,
        );
        let sum: f64 = split.stages.iter().map(|s| s.parameters).sum();
        let h = arch.hidden_size as f64;
        let norms = (2 * arch.num_layers) as f64 * h + h;
        let tied_copy = if arch.tie_word_embeddings {
            (arch.vocab_size * arch.hidden_size) as f64
        } else {
            0.0
        };
        assert_eq!(
            4.0 * sum,
            total + 3.0 * norms + tied_copy,
            "{name} on tp 4 × pp 2"
        );
    }
}

#[test]
fn the_models_shape_sets_the_mesh_constraints() {
    // Llama-2 70B: 64 heads, 8 KV heads, 80 layers; 8 GPUs per node; batch 1024 of 1.
    let arch = load_model("llama-2-70b").unwrap();
    let shape = mesh_shape(&arch, 1024, 1, 8);
    let ok = Mesh {
        dp: 32,
        tp: 8,
        sequence_parallel: true,
        pp: 4,
        schedule: PipelineSchedule::Interleaved { chunks: 5 },
        microbatches: 32,
        ..Mesh::default()
    };
    assert_eq!(ok.validate(&shape), Ok(()));
    // 80 layers over pp 4 · v 3 = 12.
    let e = Mesh {
        schedule: PipelineSchedule::Interleaved { chunks: 3 },
        ..ok
    }
    .validate(&shape)
    .unwrap_err()
    .to_string();
    assert!(e.contains("80 layers"), "{e}");
    // tp 16 leaves the node.
    let e = Mesh { tp: 16, ..ok }
        .validate(&shape)
        .unwrap_err()
        .to_string();
    assert!(e.contains("within a node"), "{e}");
}

#[test]
fn a_mixture_of_experts_splits_its_experts_over_ep_and_adds_up_to_the_inventory() {
    // Mixtral 8x7B (8 experts, 2 per token) and Qwen1.5-MoE-A2.7B (60 experts, 4 per token, a
    // shared expert with its one-output gate): on one device the mesh model's parameters are
    // the inventory's; on tp 2 × ep 4 each rank holds its dense matrices / 2, its experts / 8,
    // the norms and the router whole (the router h·E and the shared expert's gate h per layer
    // replicated like the norms).
    for name in ["mixtral-8x7b", "qwen1.5-moe-a2.7b"] {
        let arch = load_model(name).unwrap();
        let (h, l, e) = (
            arch.hidden_size as f64,
            arch.num_layers as f64,
            arch.num_experts as f64,
        );
        // Qwen2-MoE's q, k and v biases, which the mesh model leaves out (MeshModel's doc:
        // Megatron-LM's configurations run without linear biases).
        let kv = (arch.num_kv_heads * arch.head_dim) as f64;
        let biases = if arch.shared_expert_size > 0 {
            l * (h + 2.0 * kv)
        } else {
            0.0
        };
        let total = ParamInventory::of(&arch).total() as f64 - biases;
        let model = MeshModel::from_architecture(&arch, 4096, 1).unwrap();
        let single = mesh_memory(
            &model,
            &Mesh::default(),
            MeshFramework::Megatron,
            ZeroStage::default(),
            Recompute::Full,
        );
        assert_eq!(single.stages[0].parameters, total, "{name} on one device");
        let mesh = Mesh {
            dp: 4,
            tp: 2,
            sequence_parallel: true,
            ep: 4,
            ..Mesh::default()
        };
        let split = mesh_memory(
            &model,
            &mesh,
            MeshFramework::Megatron,
            ZeroStage::new(1).unwrap(),
            Recompute::Full,
        );
        let experts = l * e * 3.0 * h * arch.intermediate_size as f64;
        let gate = if arch.shared_expert_size > 0 { h } else { 0.0 };
        let replicated = l * (2.0 * h + e * h + gate) + h;
        let dense = total - experts - replicated;
        let stage = &split.stages[0];
        assert_eq!(stage.expert_parameters, experts / 8.0, "{name}");
        assert_eq!(
            stage.parameters,
            dense / 2.0 + experts / 8.0 + replicated,
            "{name}"
        );
        // ZeRO-1 (Megatron-LM's distributed optimizer) shards the experts' 12 bytes of master
        // weights and moments over the dp/ep = 1 replica holding the same experts, the rest
        // over dp = 4.
        let dense_rank = stage.parameters - stage.expert_parameters;
        assert_eq!(
            stage.model_states,
            dense_rank * (6.0 + 12.0 / 4.0) + stage.expert_parameters * 18.0,
            "{name}"
        );
    }
}

#[test]
fn models_it_cannot_cost_are_refused_with_the_reason() {
    for (name, why) in [
        ("bert-base-cased", "decoder-only"),
        ("t5-large", "decoder-only"),
    ] {
        let arch = load_model(name).unwrap();
        let e = MeshModel::from_architecture(&arch, 512, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains(name) && e.contains(why), "{e}");
    }
}

#[test]
fn the_candidate_space_of_a_70b_model_on_64_gpus() {
    // Llama-2 70B, batch 512 of 1, 8 nodes of 8: tp divides 8 (and its 8 KV heads), pp divides
    // 80 with tp·pp dividing 64, so pp ∈ {1, 2, 4, 8, 16}.
    let arch = load_model("llama-2-70b").unwrap();
    let shape = mesh_shape(&arch, 512, 1, 8);
    let all = candidate_meshes(&shape, 64, 1);
    for m in &all {
        assert_eq!(m.world_size(), 64, "{m:?}");
        assert_eq!(m.validate(&shape), Ok(()), "{m:?}");
        assert!(m.tp <= 8 && [1, 2, 4, 8, 16].contains(&m.pp), "{m:?}");
    }
    let has = |tp, pp, chunks| {
        all.iter()
            .any(|m| m.tp == tp && m.pp == pp && m.schedule.chunks() == chunks)
    };
    // torchtitan's 70B layout (FSDP × TP 8) and Megatron-style TP 8 × PP 4 interleaved by 5
    // (80 / 4 = 20 layers per stage, 4 per chunk).
    assert!(has(8, 1, 1) && has(8, 4, 5) && has(8, 4, 1));
    // 20 layers per stage do not split into 3 chunks; pp 5 leaves 64 / (8·5) fractional.
    assert!(!has(8, 4, 3) && !has(8, 5, 1) && !has(1, 5, 1));
}
