//! The mesh planner held to published runs on meshes (`tests/data/published/meshes.toml`):
//! torchtitan's H100 benchmarks of Llama 3.1 8B (FSDP × CP), 70B (FSDP × TP) and 405B (FSDP × TP
//! × PP, 1F1B and interleaved; × CP) and the Llama 3 paper's 405B pre-training meshes. Each row is planned as
//! `headroom plan` plans it with the row's pins (the mesh search, the absent axes and levers
//! searched), and must fit: every one of them ran. The goals (issue: the planner for runs that
//! outgrow data parallelism): memory within 10 % mean and 20 % worst, throughput within 25 %
//! mean; the limits below are those goals where they are met and the measured values where not.
//!
//! `cargo test -p headroom-plan --test integration published_meshes:: -- --nocapture` prints
//! the table.

use crate::support::published::{DATA, error, gib, hardware_of, mean, model_of, worst};
use headroom_plan::cost::{CostModel, Problem};
use headroom_plan::hardware::HardwareOverrides;
use headroom_plan::mesh::{Layout, MeshPins, MeshPlan, search_meshes};
use headroom_plan::strategy::{
    Checkpoint, Framework, Pins, PipelineSchedule, Precision, ZeroStage,
};
use headroom_plan::workload::{BatchSpec, Workload};
use serde::Deserialize;
use std::path::Path;

// Memory: the goals (measured 8.6 % mean, 13.2 % worst).
const MEMORY_MEAN: f64 = 0.10;
const MEMORY_WORST: f64 = 0.20;
// Throughput: the goal. Measured 13.3 % mean over the eight Megatron-LM README rows and the two
// Llama 3 rows (those two are low, 25.5 and 29.3 %, because the memory model plans full
// recompute where the run's own is not published: docs/planner.md, "Meshes held to published
// runs").
const SPEED_MEAN: f64 = 0.25;

#[derive(Deserialize)]
struct Runs {
    run: Vec<Run>,
}

/// One published mesh run as its table states it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Run {
    id: String,
    source: String,
    url: String,
    model: String,
    framework: Framework,
    #[serde(default)]
    compile: bool,
    seq_len: u64,
    global_batch: u64,
    memory_mib: Option<f64>,
    memory_kind: Option<String>,
    tokens_per_s_per_gpu: Option<f64>,
    mfu: Option<f64>,
    speed_excluded: Option<String>,
    unmodelled: Option<String>,
    hardware: HardwareOverrides,
    mesh: MeshRow,
    levers: LeverRow,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MeshRow {
    tp: Option<u64>,
    pp: Option<u64>,
    schedule: Option<String>,
    microbatches: Option<u64>,
    cp: Option<u64>,
    tp_comm_overlap: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeverRow {
    precision: Option<Precision>,
    zero: Option<u8>,
    checkpoint: Option<String>,
    micro_batch: Option<u64>,
}

/// A row planned: the best mesh plan that keeps its pins, and the measured beside the predicted.
struct Row {
    run: Run,
    plan: MeshPlan,
    /// Bytes, measured and predicted.
    memory: Option<(f64, f64)>,
    /// Tokens/s per GPU or MFU, measured and predicted.
    speed: Option<(f64, f64)>,
}

fn planned(run: Run) -> Row {
    let spec = model_of(&run.model);
    let hw = hardware_of(&run.hardware);
    let workload = Workload::new(
        &spec,
        run.seq_len,
        BatchSpec::Samples(run.global_batch),
        None,
        None,
        1,
    )
    .unwrap();
    let problem = Problem::new(spec, hw, workload, CostModel::default())
        .with_framework(run.framework)
        .with_compile(run.compile);
    let pins = Pins {
        precision: run.levers.precision,
        zero_stage: run.levers.zero.map(|z| ZeroStage::new(z).unwrap()),
        checkpoint: run
            .levers
            .checkpoint
            .as_deref()
            .map(|c| c.parse::<Checkpoint>().unwrap()),
        micro_batch: run.levers.micro_batch,
        ..Pins::default()
    };
    let mesh_pins = MeshPins {
        tp: run.mesh.tp,
        pp: run.mesh.pp,
        schedule: run
            .mesh
            .schedule
            .as_deref()
            .map(|s| s.parse::<PipelineSchedule>().unwrap()),
        microbatches: run.mesh.microbatches,
        sequence_parallel: None,
        cp: run.mesh.cp,
        ep: None,
        tp_comm_overlap: run.mesh.tp_comm_overlap,
    };
    let search = search_meshes(&problem, &pins, &mesh_pins).unwrap();
    let plan = search
        .plans
        .first()
        .unwrap_or_else(|| panic!("{}: no mesh keeps the row's pins", run.id))
        .clone();
    let memory = run.memory_mib.map(|mib| {
        let predicted = match run.memory_kind.as_deref().unwrap() {
            "reserved" => plan.peak_bytes as f64 - problem.hardware.cuda_context_bytes as f64,
            other => panic!("{}: memory_kind {other}", run.id),
        };
        (mib * 1024.0 * 1024.0, predicted)
    });
    let world = problem.hardware.world_size() as f64;
    let speed = match (run.tokens_per_s_per_gpu, run.mfu) {
        (Some(t), _) => Some((t, plan.tokens_per_s / world)),
        (None, Some(m)) => Some((m, plan.mfu)),
        (None, None) => None,
    };
    Row {
        run,
        plan,
        memory,
        speed,
    }
}

fn rows() -> Vec<Row> {
    let text = std::fs::read_to_string(Path::new(DATA).join("meshes.toml")).unwrap();
    let runs: Runs = toml::from_str(&text).unwrap();
    runs.run.into_iter().map(planned).collect()
}

fn print_table(rows: &[Row]) {
    println!(
        "| run | source | mesh | memory GiB (measured → predicted) | error | throughput (measured → predicted) | error | not modelled |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        let memory = match r.memory {
            Some((m, p)) => (
                format!("{} → {}", gib(m), gib(p)),
                format!("{:+.1} %", 100.0 * error((m, p))),
            ),
            None => (
                format!("fit → {} (fits)", gib(r.plan.peak_bytes as f64)),
                "—".into(),
            ),
        };
        let speed = match (r.speed, &r.run.speed_excluded) {
            (Some((m, p)), None) => (
                format!("{m} → {p:.2}"),
                format!("{:+.1} %", 100.0 * error((m, p))),
            ),
            (Some((m, p)), Some(why)) => (format!("{m} → {p:.2}"), format!("not counted: {why}")),
            (None, _) => ("—".into(), "—".into()),
        };
        println!(
            "| `{}` | [{}]({}) | {} · ZeRO-{} · checkpoint {} · micro-batch {} | {} | {} | {} | {} | {} |",
            r.run.id,
            r.run.source,
            r.run.url,
            Layout::Mesh(&r.plan)
                .summary(r.plan.mesh.world_size())
                .layout,
            r.plan.zero_stage.number(),
            r.plan.checkpoint,
            r.plan.micro_batch,
            memory.0,
            memory.1,
            speed.0,
            speed.1,
            r.run.unmodelled.as_deref().unwrap_or("—"),
        );
    }
}

#[test]
fn published_meshes_fit_and_are_predicted_within_the_stated_errors() {
    let rows = rows();
    print_table(&rows);
    for r in &rows {
        assert!(r.plan.fits, "{}: ran, but planned not to fit", r.run.id);
    }
    let memory: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.memory.map(|m| error(m).abs()))
        .collect();
    let speed: Vec<f64> = rows
        .iter()
        .filter(|r| r.run.speed_excluded.is_none())
        .filter_map(|r| r.speed.map(|s| error(s).abs()))
        .collect();
    println!(
        "memory: {} rows, mean |error| {:.1} %, worst {:.1} %; throughput: {} rows, mean |error| {:.1} %, worst {:.1} %",
        memory.len(),
        100.0 * mean(&memory),
        100.0 * worst(&memory),
        speed.len(),
        100.0 * mean(&speed),
        100.0 * worst(&speed)
    );
    assert!(memory.len() >= 4 && speed.len() >= 2);
    assert!(mean(&memory) <= MEMORY_MEAN, "memory mean");
    assert!(worst(&memory) <= MEMORY_WORST, "memory worst");
    assert!(mean(&speed) <= SPEED_MEAN, "throughput mean");
}
