//! The mesh search on the planner's hardware: a mesh plan's working buffers and step time
//! derived by hand, its peak the most loaded stage's, the pins kept, impossible pins refused
//! with the constraint, and plain data parallelism kept among near-equals.

use headroom_plan::cost::{CostModel, Problem, time};
use headroom_plan::hardware;
use headroom_plan::mesh::{MeshModel, MeshPins, Recompute, choose, evaluate_mesh, search_meshes};
use headroom_plan::model::load_model;
use headroom_plan::search::search;
use headroom_plan::strategy::{
    Attention, Checkpoint, Mesh, Optimizer, Pins, Placement, Precision, Strategy, ZeroStage,
};
use headroom_plan::workload::{BatchSpec, Workload};

/// Llama 3.1 8B at `seq` tokens on `nodes` nodes of 8 H100 80GB, `global` sequences per step.
fn problem(seq: u64, nodes: u64, global: u64) -> Problem {
    let spec = load_model("llama-3.1-8b").unwrap();
    let mut hw = hardware::preset("H100-80GB").unwrap();
    hw.gpus_per_node = 8;
    hw.nodes = nodes;
    let world = hw.world_size();
    let workload =
        Workload::new(&spec, seq, BatchSpec::Samples(global), None, None, world).unwrap();
    Problem::new(spec, hw, workload, CostModel::default())
}

#[test]
fn zero_3_and_full_recompute_buffers_by_hand() {
    // Llama 3.1 8B, s = 1024, b = 1, tp 2 with SP, ZeRO-3, full recompute.
    // One layer's matrices: q and o 4096² each, k and v 4096·1024 each, gate, up and down
    // 4096·14336 each: 33,554,432 + 8,388,608 + 176,160,768 = 218,103,808; / tp = 109,051,904.
    // ZeRO-3 gathers two layers in 16 bits (4 bytes per parameter) and holds one layer's fp32
    // gradients (4): 8 · 109,051,904 = 872,415,232.
    // The recomputed layer (Korthikanti's selective bytes with SP): sbh = 4,194,304;
    // 10sbh/t = 20,971,520, (8sbh + 6sbf)/t = (33,554,432 + 88,080,384)/2 = 60,817,408:
    // 81,788,928. Buffers: 954,204,160.
    let p = problem(1024, 1, 8);
    let model = MeshModel::from_architecture(&p.spec, 1024, 1).unwrap();
    let mesh = Mesh {
        dp: 4,
        tp: 2,
        sequence_parallel: true,
        microbatches: 2,
        ..Mesh::default()
    };
    let plan = evaluate_mesh(
        &p,
        &model,
        &mesh,
        Precision::Bf16Mixed,
        ZeroStage::new(3).unwrap(),
        Recompute::Full,
    );
    let stage = &plan.stages[0];
    assert_eq!(stage.buffer_bytes, 954_204_160);
    // The peak: (states + activations + buffers) × 1.1 + the CUDA context.
    let allocated = (stage.model_states_bytes + stage.activation_bytes + stage.buffer_bytes) as f64;
    let want = allocated * 1.1 + p.hardware.cuda_context_bytes as f64;
    assert!((stage.peak_bytes as f64 - want).abs() <= 2.0);
    assert_eq!(plan.peak_bytes, stage.peak_bytes);
}

#[test]
fn the_step_is_the_compute_over_m_plus_the_bubble_slots() {
    // tp 1, pp 2, 1F1B, m 16 on one node (every link NVLink): no TP traffic; per micro-batch
    // one 2·s·b·h-byte activation forward and its gradient backward (2 · 2 · 1024 · 4096 =
    // 16,777,216 bytes) at 450 GB/s; the slot is the step's compute over m plus that, and the
    // step m + p − 1 = 17 slots. ZeRO-1 over dp 4: 2Ψ fp32 (about 4·10⁹ parameters per stage,
    // 24 GB of ring traffic, 0.05 s at 450 GB/s) within the node, under ⅔ of the compute of
    // 64 sequences (about 0.4 s), so nothing exposed.
    let p = problem(1024, 1, 64);
    let model = MeshModel::from_architecture(&p.spec, 1024, 1).unwrap();
    let mesh = Mesh {
        dp: 4,
        pp: 2,
        microbatches: 16,
        ..Mesh::default()
    };
    let zero = ZeroStage::new(1).unwrap();
    let plan = evaluate_mesh(
        &p,
        &model,
        &mesh,
        Precision::Bf16Mixed,
        zero,
        Recompute::Selective,
    );
    let single = time::predict(
        &p,
        &Strategy {
            precision: Precision::Bf16Mixed,
            optimizer: Optimizer::AdamW,
            placement: Placement {
                zero_stage: zero,
                ..Placement::default()
            },
            checkpoint: Checkpoint::None,
            attention: Attention::MemoryEfficient,
            micro_batch: 1,
            accumulation: 16,
            ..Strategy::default()
        },
    );
    let compute = single.compute_s + single.memory_bound_s;
    let send = 16_777_216.0 / 450e9;
    let want = 17.0 * (compute / 16.0 + send);
    assert!(
        (plan.step_s - want).abs() < 1e-9 * want,
        "{} {want}",
        plan.step_s
    );
    assert_eq!(plan.bubble, 1.0 / 16.0);
    assert_eq!(plan.dp_exposed_s, 0.0);
}

#[test]
fn every_plan_keeps_the_pins_and_peaks_at_its_most_loaded_stage() {
    let p = problem(4096, 2, 64);
    let pins = MeshPins {
        tp: Some(2),
        ..MeshPins::default()
    };
    let found = search_meshes(&p, &Pins::default(), &pins).unwrap();
    assert!(found.evaluated > 0);
    for plan in &found.plans {
        assert_eq!(plan.mesh.tp, 2);
        assert!(plan.mesh.sequence_parallel);
        assert_eq!(plan.mesh.world_size(), 16);
        // dp · m · b is the global batch.
        assert_eq!(plan.mesh.dp * plan.mesh.microbatches * plan.micro_batch, 64);
        let max = plan.stages.iter().map(|s| s.peak_bytes).max().unwrap();
        assert_eq!(plan.peak_bytes, max);
        assert_eq!(plan.fits, plan.peak_bytes <= plan.usable_bytes);
    }
    // Fitting plans first, fastest first.
    let fitting: Vec<_> = found.plans.iter().take_while(|m| m.fits).collect();
    assert!(
        fitting
            .windows(2)
            .all(|w| w[0].tokens_per_s >= w[1].tokens_per_s)
    );
    assert!(found.plans[fitting.len()..].iter().all(|m| !m.fits));
}

#[test]
fn impossible_pins_are_refused_with_the_constraint() {
    let p = problem(4096, 2, 64);
    let refused = |pins: MeshPins| {
        search_meshes(&p, &Pins::default(), &pins)
            .unwrap_err()
            .to_string()
    };
    // Llama 3.1 8B: 32 heads, 8 key/value heads, 32 layers.
    let e = refused(MeshPins {
        tp: Some(16),
        ..MeshPins::default()
    });
    assert!(e.contains("within a node"), "{e}");
    let e = refused(MeshPins {
        pp: Some(16),
        schedule: Some("interleaved:4".parse().unwrap()),
        ..MeshPins::default()
    });
    assert!(
        e.contains("32 layers are not divisible by pp·v = 16·4"),
        "{e}"
    );
    let e = refused(MeshPins {
        microbatches: Some(3),
        pp: Some(2),
        ..MeshPins::default()
    });
    assert!(e.contains("global batch of 64"), "{e}");
}

#[test]
fn plain_data_parallelism_is_kept_within_five_percent() {
    // The 8B fits with plain data parallelism on 16 GPUs; the recommendation is a mesh only
    // when the fastest fitting mesh is more than 5 % faster than the best plain plan.
    let p = problem(4096, 2, 64);
    let plain = search(&p, &Pins::default(), None).unwrap();
    let meshes = search_meshes(&p, &Pins::default(), &MeshPins::default()).unwrap();
    let choice = choose(Some(&plain), &meshes.plans, 16);
    let best_plain = plain.recommended().unwrap();
    let best_mesh = meshes.plans.iter().find(|m| m.fits).unwrap();
    let mesh_wins = best_plain.time.step_s > best_mesh.step_s * 1.05;
    let summary = choice.recommended.unwrap().summary(16);
    assert_eq!(summary.tp > 1 || summary.pp > 1, mesh_wins);
}
