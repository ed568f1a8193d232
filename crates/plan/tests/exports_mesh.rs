//! The torchtitan and Megatron-LM exports write the mesh the plan predicted (values derived by
//! hand from the layout), only keys and values those frameworks document
//! (tests/support/mesh_schemas.rs), and refuse with the reason what they cannot run; the
//! documented working combinations (`export::mesh_rules`) reject broken files.

use crate::support;

use headroom_plan::cost::{CostModel, Problem, evaluate};
use headroom_plan::export::megatron::megatron_args;
use headroom_plan::export::mesh_rules::{self, MeshRule};
use headroom_plan::export::mesh_run::{MeshRun, Recompute};
use headroom_plan::export::torchtitan::torchtitan_toml;
use headroom_plan::hardware;
use headroom_plan::mesh::{self, MeshModel, evaluate_mesh};
use headroom_plan::model::load_model;
use headroom_plan::strategy::{
    Attention, Checkpoint, Mesh, Optimizer, PipelineSchedule, Placement, Precision, Strategy,
    ZeroStage,
};
use headroom_plan::workload::{BatchSpec, Workload};
use support::mesh_schemas::{check_megatron, check_torchtitan};

/// `model` at 8,192 tokens on `nodes` nodes of 8 H100 80GB, `global` sequences per step.
fn problem(model: &str, nodes: u64, global: u64) -> Problem {
    let spec = load_model(model).unwrap();
    let mut hw = hardware::preset("H100-80GB").unwrap();
    hw.gpus_per_node = 8;
    hw.nodes = nodes;
    // Below one sequence per GPU only meshes run it: the workload is then split over one
    // device, as `headroom plan` does.
    let world = hw.world_size();
    let devices = if global >= world { world } else { 1 };
    let workload =
        Workload::new(&spec, 8192, BatchSpec::Samples(global), None, None, devices).unwrap();
    Problem::new(spec, hw, workload, CostModel::default())
}

/// Llama 3.1 70B (80 layers) on 64 GPUs as dp 2 × tp 8 × pp 4, interleaved with 2 chunks,
/// 8 micro-batches of one sequence per replica: a global batch of 2 · 8 · 1 = 16.
fn interleaved_70b(zero: u8, recompute: mesh::Recompute) -> (Problem, MeshRun) {
    let p = problem("llama-3.1-70b", 8, 16);
    let model = MeshModel::from_architecture(&p.spec, 8192, 1).unwrap();
    let m = Mesh {
        dp: 2,
        tp: 8,
        sequence_parallel: true,
        pp: 4,
        schedule: PipelineSchedule::Interleaved { chunks: 2 },
        microbatches: 8,
        ..Mesh::default()
    };
    let plan = evaluate_mesh(
        &p,
        &model,
        &m,
        Precision::Bf16Mixed,
        ZeroStage::new(zero).unwrap(),
        recompute,
    );
    let run = MeshRun::of_mesh(&p, &plan, "test").unwrap();
    (p, run)
}

#[test]
fn torchtitan_writes_the_interleaved_mesh() {
    let (p, run) = interleaved_70b(3, mesh::Recompute::Full);
    let text = torchtitan_toml(&p, &run).unwrap();
    let v = check_torchtitan(&text);
    let get = |k: &str| v.get(k).map(String::as_str);
    assert_eq!(get("model.flavor"), Some("70B"));
    assert_eq!(get("parallelism.data_parallel_shard_degree"), Some("2"));
    assert_eq!(get("parallelism.tensor_parallel_degree"), Some("8"));
    assert_eq!(get("parallelism.pipeline_parallel_degree"), Some("4"));
    assert_eq!(
        get("parallelism.pipeline_parallel_schedule"),
        Some("Interleaved1F1B")
    );
    // 80 layers over pp · v = 4 · 2 = 8 stages: 10 layers each, none taken off the ends.
    assert_eq!(
        get("parallelism.pipeline_parallel_layers_per_stage"),
        Some("10")
    );
    assert_eq!(
        get("parallelism.pipeline_parallel_first_stage_less_layers"),
        Some("0")
    );
    // ZeRO-3 under a pipeline: torchtitan's "default" would keep the gathered weights.
    assert_eq!(
        get("parallelism.fsdp_reshard_after_forward"),
        Some("always")
    );
    // Local batch 8 micro-batches × 1 sequence; global 2 replicas × 8 = 16.
    assert_eq!(get("training.local_batch_size"), Some("8"));
    assert_eq!(
        get("parallelism.pipeline_parallel_microbatch_size"),
        Some("1")
    );
    assert_eq!(get("training.global_batch_size"), Some("16"));
    assert_eq!(get("training.seq_len"), Some("8192"));
    assert_eq!(get("activation_checkpoint.mode"), Some("full"));
    assert_eq!(get("training.mixed_precision_param"), Some("bfloat16"));
}

#[test]
fn megatron_writes_the_interleaved_mesh() {
    let (p, run) = interleaved_70b(1, mesh::Recompute::Full);
    let text = megatron_args(&p, &run).unwrap();
    let v = check_megatron(&text);
    let get = |k: &str| v.get(k).map(String::as_str);
    assert_eq!(get("--num-layers"), Some("80"));
    assert_eq!(get("--hidden-size"), Some("8192"));
    assert_eq!(get("--ffn-hidden-size"), Some("28672"));
    assert_eq!(get("--num-query-groups"), Some("8"));
    assert_eq!(get("--tensor-model-parallel-size"), Some("8"));
    assert_eq!(get("--sequence-parallel"), Some(""));
    assert_eq!(get("--pipeline-model-parallel-size"), Some("4"));
    assert_eq!(get("--num-layers-per-virtual-pipeline-stage"), Some("10"));
    assert_eq!(get("--use-distributed-optimizer"), Some(""));
    assert_eq!(get("--use-megatron-fsdp"), None);
    assert_eq!(get("--micro-batch-size"), Some("1"));
    assert_eq!(get("--global-batch-size"), Some("16"));
    assert_eq!(get("--recompute-granularity"), Some("full"));
    assert_eq!(get("--recompute-method"), Some("uniform"));
    assert_eq!(get("--recompute-num-layers"), Some("1"));
    // Llama 3.1's vocabulary 128,256 padded to a multiple of 128 · 8 = 1,024: 129,024.
    assert!(text.contains("vocabulary 128256 padded to 129024"));
}

#[test]
fn what_the_frameworks_cannot_run_is_refused_with_the_reason() {
    // torchtitan: ZeRO-1 has no FSDP2 form.
    let (p, run) = interleaved_70b(1, mesh::Recompute::Full);
    let e = torchtitan_toml(&p, &run).unwrap_err().to_string();
    assert!(e.contains("ZeRO-1") && e.contains("--emit megatron"), "{e}");
    // Megatron-FSDP (ZeRO-3) beside a pipeline.
    let (p, run) = interleaved_70b(3, mesh::Recompute::Full);
    let e = megatron_args(&p, &run).unwrap_err().to_string();
    assert!(e.contains("pin --zero 1"), "{e}");
    // torchtitan's tensor parallelism always shards the norms.
    let mut no_sp = run;
    no_sp.mesh.sequence_parallel = false;
    let e = torchtitan_toml(&p, &no_sp).unwrap_err().to_string();
    assert!(e.contains("--sequence-parallel on"), "{e}");
    // Llama-2-7B is none of torchtitan's llama3 flavors.
    let p7 = problem("llama-2-7b", 1, 8);
    let run7 = MeshRun {
        mesh: Mesh {
            dp: 8,
            ..Mesh::default()
        },
        zero_stage: ZeroStage::new(3).unwrap(),
        recompute: Recompute::Nothing,
        micro_batch: 1,
        microbatches: 1,
        seq_len: 4096,
    };
    let e = torchtitan_toml(&p7, &run7).unwrap_err().to_string();
    assert!(
        e.contains("8B, 70B and 405B") && e.contains("hidden 4096, 32 layers"),
        "{e}"
    );
    // …which Megatron-LM writes.
    let v = check_megatron(&megatron_args(&p7, &run7).unwrap());
    assert_eq!(
        v.get("--num-query-groups"),
        None,
        "Llama-2-7B has no grouped KV heads"
    );
    assert_eq!(
        v.get("--data-parallel-sharding-strategy")
            .map(String::as_str),
        Some("optim_grads_params")
    );
}

#[test]
fn a_plain_plan_exports_as_fsdp_or_is_refused_for_its_levers() {
    // Llama 3.1 8B on 8 GPUs, FSDP (ZeRO-3), one layer in 2 recomputed, micro-batch 2 × 2
    // accumulated: global 8 · 2 · 2 = 32.
    let p = problem("llama-3.1-8b", 1, 32);
    let mut s = Strategy {
        precision: Precision::Bf16Mixed,
        optimizer: Optimizer::AdamW,
        placement: Placement {
            zero_stage: ZeroStage::new(3).unwrap(),
            ..Placement::default()
        },
        checkpoint: Checkpoint::EveryNth(2),
        attention: Attention::MemoryEfficient,
        micro_batch: 2,
        accumulation: 2,
        ..Strategy::default()
    };
    let run = MeshRun::of_plain(&p, &evaluate(&p, &s), 8, "torchtitan").unwrap();
    let v = check_torchtitan(&torchtitan_toml(&p, &run).unwrap());
    let get = |k: &str| v.get(k).map(String::as_str);
    assert_eq!(get("parallelism.data_parallel_shard_degree"), Some("8"));
    assert_eq!(get("parallelism.pipeline_parallel_degree"), Some("1"));
    assert_eq!(get("training.local_batch_size"), Some("2"));
    assert_eq!(get("training.global_batch_size"), Some("32"));
    assert_eq!(get("activation_checkpoint.mode"), Some("selective"));
    assert_eq!(get("activation_checkpoint.selective_ac_option"), Some("2"));
    // Megatron: one layer in 2 of 32 is block recompute of 16 layers.
    let m = check_megatron(&megatron_args(&p, &run).unwrap());
    assert_eq!(
        m.get("--recompute-method").map(String::as_str),
        Some("block")
    );
    assert_eq!(
        m.get("--recompute-num-layers").map(String::as_str),
        Some("16")
    );
    // Offload has no key in either.
    s.placement.offload_optimizer = headroom_plan::strategy::Offload::Cpu;
    let e = MeshRun::of_plain(&p, &evaluate(&p, &s), 8, "torchtitan")
        .unwrap_err()
        .to_string();
    assert!(e.contains("--offload-optimizer none"), "{e}");
}

#[test]
fn the_rules_reject_what_torchtitan_and_megatron_refuse() {
    let job = |s: &str| -> toml::Table { s.parse().unwrap() };
    assert_eq!(
        mesh_rules::torchtitan(
            &job("[parallelism]\ndata_parallel_replicate_degree = 2\ntensor_parallel_degree = 2\n"),
            32
        ),
        Err(MeshRule::DdpWithOtherParallelism)
    );
    // 80 layers, 20 per stage, pp 4: 4 stages, one per rank, which Interleaved1F1B refuses.
    let interleaved = "[parallelism]\npipeline_parallel_degree = 4\npipeline_parallel_schedule = \"Interleaved1F1B\"\npipeline_parallel_layers_per_stage = 20\npipeline_parallel_first_stage_less_layers = 0\npipeline_parallel_last_stage_less_layers = 0\n";
    assert!(matches!(
        mesh_rules::torchtitan(&job(interleaved), 80),
        Err(MeshRule::StagesPerRank { .. })
    ));
    // 10 per stage: 8 stages, two per rank: accepted.
    assert_eq!(
        mesh_rules::torchtitan(&job(&interleaved.replace("= 20", "= 10")), 80),
        Ok(())
    );
    // torchtitan's default first/last stage one layer less: (80 + 2)/10 → 9 stages on 4 ranks.
    let uneven = interleaved
        .replace("= 20", "= 10")
        .replace("less_layers = 0", "less_layers = 1");
    assert!(mesh_rules::torchtitan(&job(&uneven), 80).is_err());
    let args = |pairs: &[(&str, &str)]| -> Vec<(String, Option<String>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), (!v.is_empty()).then(|| v.to_string())))
            .collect()
    };
    assert_eq!(
        mesh_rules::megatron(
            &args(&[
                ("--micro-batch-size", "2"),
                ("--global-batch-size", "12"),
                ("--num-layers", "8")
            ]),
            4
        ),
        Err(MeshRule::GlobalBatchSplit {
            global: 12,
            micro: 2,
            dp: 4
        })
    );
    assert_eq!(
        mesh_rules::megatron(
            &args(&[("--sequence-parallel", ""), ("--num-layers", "8")]),
            1
        ),
        Err(MeshRule::SequenceParallelWithoutTp)
    );
    assert_eq!(
        mesh_rules::megatron(
            &args(&[
                ("--tensor-model-parallel-size", "8"),
                ("--tp-comm-overlap", ""),
                ("--num-layers", "8")
            ]),
            1
        ),
        Err(MeshRule::TpCommOverlapWithoutSp)
    );
    assert_eq!(
        mesh_rules::torchtitan(
            &job(
                "[parallelism]\ntensor_parallel_degree = 8\nenable_async_tensor_parallel = true\n"
            ),
            32
        ),
        Err(MeshRule::AsyncTpWithoutCompile)
    );
}

#[test]
fn overlapped_tensor_parallelism_is_written_for_each_framework() {
    let (mut p, mut run) = interleaved_70b(1, mesh::Recompute::Full);
    run.mesh.tp_comm_overlap = true;
    // Megatron-LM: the switch, beside the sequence parallelism it needs.
    let v = check_megatron(&megatron_args(&p, &run).unwrap());
    assert_eq!(v.get("--tp-comm-overlap").map(String::as_str), Some(""));
    assert_eq!(v.get("--sequence-parallel").map(String::as_str), Some(""));
    // torchtitan's async TP needs a compiled model: refused without --compile, written with.
    run.zero_stage = ZeroStage::new(3).unwrap();
    let e = torchtitan_toml(&p, &run).unwrap_err().to_string();
    assert!(e.contains("--compile"), "{e}");
    p = p.with_compile(true);
    let v = check_torchtitan(&torchtitan_toml(&p, &run).unwrap());
    assert_eq!(
        v.get("parallelism.enable_async_tensor_parallel")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(v.get("compile.enable").map(String::as_str), Some("true"));
}

#[test]
fn an_uneven_pipeline_is_written_as_each_framework_splits_it() {
    // Llama 3.1 405B (126 layers) on 512 GPUs as torchtitan ran it: dp 8 × tp 8 × pp 8, 1F1B,
    // 32 micro-batches of one sequence (global 256), one layer fewer on the first and last
    // stage: (126 + 2)/8 = 16 per stage, 15 at the ends.
    let p = problem("llama-3.1-405b", 64, 256);
    let model = MeshModel::from_architecture(&p.spec, 8192, 1).unwrap();
    let m = Mesh {
        dp: 8,
        tp: 8,
        sequence_parallel: true,
        pp: 8,
        microbatches: 32,
        fewer_layers_at_ends: 1,
        ..Mesh::default()
    };
    let plan = evaluate_mesh(
        &p,
        &model,
        &m,
        Precision::Bf16Mixed,
        ZeroStage::new(3).unwrap(),
        mesh::Recompute::Full,
    );
    let layers: Vec<u64> = plan.stages.iter().map(|s| s.layers).collect();
    assert_eq!(layers, vec![15, 16, 16, 16, 16, 16, 16, 15]);
    let run = MeshRun::of_mesh(&p, &plan, "test").unwrap();
    let v = check_torchtitan(&torchtitan_toml(&p, &run).unwrap());
    let get = |k: &str| v.get(k).map(String::as_str);
    assert_eq!(
        get("parallelism.pipeline_parallel_layers_per_stage"),
        Some("16")
    );
    assert_eq!(
        get("parallelism.pipeline_parallel_first_stage_less_layers"),
        Some("1")
    );
    assert_eq!(
        get("parallelism.pipeline_parallel_last_stage_less_layers"),
        Some("1")
    );
    assert_eq!(get("training.local_batch_size"), Some("32"));
    assert_eq!(get("training.global_batch_size"), Some("256"));
    // Megatron-LM (ZeRO-1 here: its FSDP is not combined with a pipeline): 15 on the first and
    // last stage, (126 − 30)/6 = 16 on each of the other six.
    let mut run1 = run;
    run1.zero_stage = ZeroStage::new(1).unwrap();
    let a = check_megatron(&megatron_args(&p, &run1).unwrap());
    assert_eq!(
        a.get("--decoder-first-pipeline-num-layers")
            .map(String::as_str),
        Some("15")
    );
    assert_eq!(
        a.get("--decoder-last-pipeline-num-layers")
            .map(String::as_str),
        Some("15")
    );
    assert_eq!(a.get("--num-layers-per-virtual-pipeline-stage"), None);
    // Interleaved, Megatron-LM would take the layers off every chunk of the end stages.
    run1.mesh.pp = 4;
    run1.mesh.dp = 16;
    run1.mesh.microbatches = 16;
    run1.mesh.schedule = PipelineSchedule::Interleaved { chunks: 2 };
    let e = megatron_args(&p, &run1).unwrap_err().to_string();
    assert!(e.contains("every chunk of the first and last stage"), "{e}");
}
