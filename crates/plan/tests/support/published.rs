//! Published training runs read from a TOML table (`tests/data/published/*.toml`) and planned:
//! the row's fields, the planning problem they describe, and the measured beside the predicted
//! memory and throughput. Shared by the tests that hold the planner to those tables.

use headroom_plan::cost::{CostModel, Plan, Problem, evaluate};
use headroom_plan::hardware::{self, Hardware, HardwareOverrides};
use headroom_plan::model::{Architecture, load_model};
use headroom_plan::strategy::{
    BaseDtype, BaseWeights, Category, Framework, Lora, LoraTargets, LossImpl, OptimizerImpl,
    Strategy, ZeroGrad,
};
use headroom_plan::workload::{BatchSpec, Workload};
use serde::Deserialize;
use std::path::Path;

/// The folder of the tables and the config.json files their rows name.
pub const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/published");

#[derive(Deserialize)]
struct Runs {
    run: Vec<Run>,
}

/// One published run as its table states it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    pub id: String,
    pub source: String,
    pub url: String,
    pub model: String,
    pub framework: Framework,
    pub optimizer_impl: OptimizerImpl,
    #[serde(default)]
    pub loss_impl: LossImpl,
    /// What the run's `zero_grad()` did between steps (PyTorch before 2.0: zero-fill).
    #[serde(default)]
    pub zero_grad: ZeroGrad,
    /// The GPU's saturated efficiency is fitted to this row: its throughput is reproduced by
    /// construction and not counted in the errors.
    #[serde(default)]
    pub fitted: bool,
    /// The speed-model constant fitted to this row (`half_efficiency_intensity`).
    pub fitted_constant: Option<String>,
    /// Why the row's measured peak and throughput, or its fit verdict, are kept out of the errors
    /// (its setting cannot be pinned down from its source, or the planner cannot express it);
    /// shown in the printed table.
    pub excluded: Option<String>,
    /// Why only the row's throughput is kept out of the errors (e.g. a GPU whose clocks the
    /// source leaves open); shown in the printed table.
    pub speed_excluded: Option<String>,
    /// The model is transformers' own modules although the loss is computed outside it
    /// (`loss_impl` other than `hugging-face`, e.g. `logits.sum()` in a benchmark loop).
    #[serde(default)]
    pub transformers_model: bool,
    /// The run used `torch.compile`.
    #[serde(default)]
    pub compile: bool,
    /// The source reports that this setting ran out of memory.
    #[serde(default)]
    pub oom: bool,
    pub seq_len: u64,
    pub memory_mib: Option<f64>,
    pub memory_kind: Option<String>,
    pub samples_per_s: Option<f64>,
    pub tokens_per_s_per_gpu: Option<f64>,
    pub lora_rank: Option<usize>,
    pub lora_alpha: Option<f32>,
    pub lora_targets: Option<String>,
    pub lora_base: Option<String>,
    /// The dtype the frozen base was loaded in (`torch_dtype`).
    pub lora_base_dtype: Option<BaseDtype>,
    /// PEFT's `lora_dropout` of the run (none: 0).
    pub lora_dropout: Option<f32>,
    /// DeepSpeed's `reduce_bucket_size` where the run's config sets it.
    pub bucket_elements: Option<u64>,
    pub hardware: HardwareOverrides,
    pub strategy: Strategy,
}

/// One run planned: the problem, the plan, and the measured and predicted figures (bytes for
/// memory, tokens per second per GPU for speed).
pub struct Row {
    pub run: Run,
    pub problem: Problem,
    pub plan: Plan,
    pub memory: Option<(f64, f64)>,
    pub speed: Option<(f64, f64)>,
}

impl Row {
    /// Whether the row's throughput is held to the model (no constant of it fitted to the row).
    pub fn held(&self) -> bool {
        !self.run.fitted && self.run.fitted_constant.is_none()
    }

    /// The row's measured peak and prediction where they count in the errors.
    pub fn counted_memory(&self) -> Option<(f64, f64)> {
        self.memory.filter(|_| self.run.excluded.is_none())
    }

    /// The row's measured throughput and prediction where they count in the errors.
    pub fn counted_speed(&self) -> Option<(f64, f64)> {
        self.speed
            .filter(|_| self.held() && self.run.excluded.is_none())
            .filter(|_| self.run.speed_excluded.is_none())
    }
}

/// A row's model: a built-in name, or a config.json in [`DATA`].
pub fn model_of(name: &str) -> Architecture {
    let path = match name.ends_with(".json") {
        true => Path::new(DATA).join(name).display().to_string(),
        false => name.to_string(),
    };
    load_model(&path).unwrap()
}

/// A row's hardware: its GPU preset with the row's overrides applied.
pub fn hardware_of(overrides: &HardwareOverrides) -> Hardware {
    let gpu = overrides.gpu.clone().unwrap();
    let mut hw = hardware::resolve(&gpu, &[overrides]).unwrap();
    hw.apply(&HardwareOverrides {
        gpu: None,
        ..overrides.clone()
    })
    .unwrap();
    hw
}

/// The planning problem a row describes: its model, its hardware (a preset with the row's
/// overrides), its batch, LoRA and implementation choices.
pub fn problem_of(run: &Run) -> Problem {
    let spec = model_of(&run.model);
    let hw = hardware_of(&run.hardware);
    let s = &run.strategy;
    let split = BatchSpec::Split {
        micro_batch: s.micro_batch,
        accumulation: s.accumulation,
    };
    let world = hw.world_size();
    let workload = Workload::new(
        &spec,
        run.seq_len,
        split,
        Some(s.micro_batch),
        Some(s.accumulation),
        world,
    )
    .unwrap();
    let workload = match run.lora_rank {
        Some(rank) => {
            let targets: LoraTargets = run.lora_targets.as_deref().unwrap().parse().unwrap();
            let base: BaseWeights = run.lora_base.as_deref().unwrap_or("plain").parse().unwrap();
            let lora = Lora::new(rank, run.lora_alpha.unwrap(), targets, base).unwrap();
            let w = workload.with_lora(&spec, lora).unwrap();
            let w = match run.lora_base_dtype {
                Some(dtype) => w.with_lora_base_dtype(dtype).unwrap(),
                None => w,
            };
            match run.lora_dropout {
                Some(p) => w.with_lora_dropout(p).unwrap(),
                None => w,
            }
        }
        None => {
            assert!(
                run.lora_base_dtype.is_none() && run.lora_dropout.is_none(),
                "{}: lora_base_dtype or lora_dropout without LoRA",
                run.id
            );
            workload
        }
    };
    let cost = CostModel {
        bucket_elements: run
            .bucket_elements
            .unwrap_or(CostModel::default().bucket_elements),
        ..CostModel::default()
    };
    let mut problem = Problem::new(spec, hw, workload, cost)
        .with_framework(run.framework)
        .with_optimizer_impl(run.optimizer_impl)
        .with_loss_impl(run.loss_impl)
        .with_zero_grad(run.zero_grad)
        .with_compile(run.compile);
    problem.spec.transformers_modules |= run.transformers_model;
    problem
}

/// Every row of the table `file` (in [`DATA`]) planned with its own strategy.
pub fn rows(file: &str) -> Vec<Row> {
    let text = std::fs::read_to_string(Path::new(DATA).join(file)).unwrap();
    let runs: Runs = toml::from_str(&text).unwrap();
    runs.run.into_iter().map(planned).collect()
}

fn planned(run: Run) -> Row {
    let problem = problem_of(&run);
    let plan = evaluate(&problem, &run.strategy);
    let at_peak = &plan.memory.breakdown.at_peak;
    let peak = plan.memory.per_device_peak_bytes as f64;
    let memory = run.memory_mib.map(|mib| {
        let predicted = match run.memory_kind.as_deref().unwrap() {
            "device-used" => peak,
            "reserved" => peak - problem.hardware.cuda_context_bytes as f64,
            "active" => peak - at_peak[Category::Other] as f64,
            other => panic!("{}: memory_kind {other}", run.id),
        };
        (mib * 1024.0 * 1024.0, predicted)
    });
    let world = problem.hardware.world_size() as f64;
    let measured = run
        .tokens_per_s_per_gpu
        .or(run.samples_per_s.map(|s| s * run.seq_len as f64 / world));
    let speed = measured.map(|m| (m, plan.time.tokens_per_s / world));
    Row {
        run,
        problem,
        plan,
        memory,
        speed,
    }
}

/// Predicted over measured, less one.
pub fn error((measured, predicted): (f64, f64)) -> f64 {
    predicted / measured - 1.0
}

pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

pub fn worst(v: &[f64]) -> f64 {
    v.iter().cloned().fold(0.0, f64::max)
}

pub fn gib(b: f64) -> String {
    format!("{:.2}", b / (1u64 << 30) as f64)
}

/// Prints the rows as a Markdown table (the one docs/planner.md shows).
pub fn print_table(rows: &[Row]) {
    println!(
        "| run | source | memory published → predicted (GiB) | error | tokens/s/GPU published → predicted | error |"
    );
    println!("|---|---|---|---|---|---|");
    for r in rows {
        let mem = match (r.memory, r.run.oom) {
            (Some(m), _) => format!(
                "{} → {} ({})",
                gib(m.0),
                gib(m.1),
                r.run.memory_kind.as_deref().unwrap()
            ),
            (None, true) => format!(
                "out of memory → {} {}",
                gib(r.plan.memory.per_device_peak_bytes as f64),
                if r.plan.fits {
                    "(fits)"
                } else {
                    "(does not fit)"
                }
            ),
            (None, false) => format!(
                "fit → {} {}",
                gib(r.plan.memory.per_device_peak_bytes as f64),
                if r.plan.fits {
                    "(fits)"
                } else {
                    "(does not fit)"
                }
            ),
        };
        let mem_err = match (r.memory, &r.run.excluded) {
            (None, None) => "—".into(),
            (None, Some(why)) => format!("verdict not counted: {why}"),
            (Some(m), None) => format!("{:+.1} %", 100.0 * error(m)),
            (Some(m), Some(why)) => format!("{:+.1} % (not counted: {why})", 100.0 * error(m)),
        };
        let speed = r
            .speed
            .map_or("—".into(), |s| format!("{:.0} → {:.0}", s.0, s.1));
        let why = r.run.excluded.as_ref().or(r.run.speed_excluded.as_ref());
        let speed_err = r.speed.map_or("—".into(), |s| match (r.held(), why) {
            (false, _) => "fitted".into(),
            (true, None) => format!("{:+.1} %", 100.0 * error(s)),
            (true, Some(why)) => format!("{:+.1} % (not counted: {why})", 100.0 * error(s)),
        });
        println!(
            "| `{}` | [{}]({}) | {mem} | {mem_err} | {speed} | {speed_err} |",
            r.run.id, r.run.source, r.run.url
        );
    }
}
