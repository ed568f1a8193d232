//! The doctor's side JSON (`--side run.json`): the run a trace came from — its model, device,
//! sequence length, batch split and strategy, in `headroom plan`'s terms — read, checked, turned
//! into the planner's problem, compared with the trace (what does not match it), and the levers
//! ranked for that run.
//!
//! Not for: the ranking itself (`headroom_plan::levers`) or the trace's analyses
//! (`headroom_memory::doctor`).

use anyhow::{Context, Result, bail};
use headroom_memory::Category;
use headroom_memory::doctor::Diagnosis;
use headroom_memory::size::{ByteSize, format_bytes};
use headroom_plan::cost::{CostModel, Problem, evaluate};
use headroom_plan::hardware::{self, HardwareOverrides};
use headroom_plan::levers::{LeverRanking, rank};
use headroom_plan::strategy::{
    Attention, Checkpoint, Framework, Loss, Offload, Optimizer, Placement, Precision, Strategy,
    ZeroStage,
};
use headroom_plan::workload::{BatchSpec, Workload};
use headroom_train::models::hugging_face_model;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The GPU whose figures a side JSON that gives only `capacity` is costed with (bf16 capable;
/// its speed does not enter the memory the levers are ranked by).
const CAPACITY_ONLY_GPU: &str = "H100-80GB";

/// The side JSON as written. Keys are `headroom plan`'s flags with `_` for `-`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SideFile {
    /// A built-in model name or the path of a Hugging Face `config.json` (relative paths are
    /// read from the side JSON's directory).
    pub model: String,
    /// A GPU preset (`headroom plan --gpu`).
    pub gpu: Option<String>,
    /// The device's memory (`"24GiB"`, `"80GB"` or bytes); with `gpu`, it replaces the preset's.
    pub capacity: Option<ByteSize>,
    #[serde(default = "one")]
    pub gpus_per_node: u64,
    #[serde(default = "one")]
    pub nodes: u64,
    pub seq_len: u64,
    pub micro_batch: u64,
    #[serde(default = "one")]
    pub accumulation: u64,
    #[serde(default)]
    pub precision: Precision,
    #[serde(default)]
    pub optimizer: Optimizer,
    #[serde(default)]
    pub zero: u8,
    #[serde(default)]
    pub offload_optimizer: Offload,
    #[serde(default)]
    pub offload_params: Offload,
    #[serde(default)]
    pub checkpoint: Checkpoint,
    #[serde(default)]
    pub attention: Attention,
    #[serde(default)]
    pub loss: Loss,
    /// Whose memory layout to predict: deepspeed (the default) or fsdp.
    pub framework: Option<Framework>,
}

fn one() -> u64 {
    1
}

/// A side JSON checked and turned into the planner's terms.
pub struct Side {
    pub problem: Problem,
    pub strategy: Strategy,
    pub model: String,
}

/// Reads and checks `path`; every error names the key and what is accepted.
pub fn read_side(path: &Path) -> Result<Side> {
    let text = std::fs::read_to_string(path).context("cannot read the side JSON")?;
    side_from_text(&text, path.parent().unwrap_or(Path::new(".")))
}

/// Checks a side JSON's text; a relative model path is read from `base`, the folder it came from.
pub fn side_from_text(text: &str, base: &Path) -> Result<Side> {
    let file: SideFile = serde_json::from_str(text).context(
        "not a side JSON: expected an object with \"model\", \"gpu\" or \"capacity\", \"seq_len\", \"micro_batch\" and optionally \"accumulation\", \"precision\", \"optimizer\", \"zero\", \"offload_optimizer\", \"offload_params\", \"checkpoint\", \"attention\", \"loss\", \"framework\", \"gpus_per_node\", \"nodes\" (docs/doctor.md)",
    )?;
    let model = match Path::new(&file.model) {
        p if p.is_relative() && (file.model.ends_with(".json") || file.model.contains('/')) => {
            let beside = base.join(p);
            if beside.exists() {
                beside.display().to_string()
            } else {
                file.model.clone()
            }
        }
        _ => file.model.clone(),
    };
    let spec = hugging_face_model(&model).with_context(|| format!("\"model\": {}", file.model))?;
    if file.seq_len == 0 {
        bail!("\"seq_len\" is 0; accepted: a positive number of tokens");
    }
    if file.micro_batch == 0 || file.accumulation == 0 {
        bail!("\"micro_batch\" and \"accumulation\" must be at least 1");
    }
    if file.gpus_per_node == 0 || file.nodes == 0 {
        bail!("\"gpus_per_node\" and \"nodes\" must be at least 1");
    }
    if file.capacity.is_some_and(|c| c.0 == 0) {
        bail!("\"capacity\" is 0 bytes; accepted: the device's memory, e.g. \"24GiB\"");
    }
    let zero = ZeroStage::new(file.zero)
        .map_err(|_| anyhow::anyhow!("\"zero\" is {}; accepted: 0, 1, 2, 3", file.zero))?;
    let gpu = match (&file.gpu, file.capacity) {
        (Some(g), _) => g.clone(),
        (None, Some(_)) => CAPACITY_ONLY_GPU.to_string(),
        (None, None) => bail!(
            "the side JSON names no device: give \"gpu\" (one of {}) or \"capacity\" (e.g. \"24GiB\")",
            hardware::gpu_preset_names().join(", ")
        ),
    };
    let overrides = HardwareOverrides {
        gpus_per_node: Some(file.gpus_per_node),
        nodes: Some(file.nodes),
        gpu_memory: file.capacity,
        ..HardwareOverrides::default()
    };
    let mut hw = hardware::resolve(&gpu, &[&overrides]).context("\"gpu\"")?;
    hw.apply(&overrides).context("\"gpu\"")?;
    let strategy = Strategy {
        precision: file.precision,
        optimizer: file.optimizer,
        placement: Placement {
            zero_stage: zero,
            offload_optimizer: file.offload_optimizer,
            offload_params: file.offload_params,
            offload_activations: Offload::None,
        },
        checkpoint: file.checkpoint,
        attention: file.attention,
        loss: file.loss,
        optimizer_in_backward: false,
        micro_batch: file.micro_batch,
        accumulation: file.accumulation,
    };
    if let Some(why) = strategy.incompatibility() {
        bail!("the side JSON's strategy cannot run: {why}");
    }
    if file.precision.needs_bf16() && hw.gpu.bf16_tflops <= 0.0 {
        bail!(
            "\"precision\": {} needs bf16, which {} lacks; accepted: fp16-mixed, fp32",
            file.precision,
            hw.gpu.name
        );
    }
    let world = hw.world_size();
    let workload = Workload::new(
        &spec,
        file.seq_len,
        BatchSpec::Split {
            micro_batch: file.micro_batch,
            accumulation: file.accumulation,
        },
        Some(file.micro_batch),
        Some(file.accumulation),
        world,
    )
    .context("the side JSON's batch")?;
    let problem = Problem::new(spec, hw, workload, CostModel::default())
        .with_framework(file.framework.unwrap_or_default());
    Ok(Side {
        problem,
        strategy,
        model: file.model,
    })
}

/// What the side JSON says of the run, set against the trace.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub model: String,
    pub parameters: u64,
    pub device: String,
    pub capacity_bytes: u64,
    pub strategy: Strategy,
    /// The planner's prediction for the stated strategy.
    pub predicted_peak_bytes: u64,
    pub levers: LeverRanking,
    /// Where the trace and the side JSON disagree, in words.
    pub mismatches: Vec<String>,
}

/// Parameter bytes within this fraction of each other match.
const PARAMETER_TOLERANCE: f64 = 0.10;

/// The side JSON's run: the levers, and what does not match `diagnosis`.
pub fn report(side: &Side, diagnosis: &Diagnosis, capacity_flag: Option<u64>) -> RunReport {
    let p = &side.problem;
    let plan = evaluate(p, &side.strategy);
    let capacity = p.hardware.gpu.memory_bytes;
    let mut mismatches = Vec::new();
    if let Some(c) = capacity_flag
        && c != capacity
    {
        mismatches.push(format!(
            "--capacity {} differs from the side JSON's device ({}, {}): the replays used --capacity, the levers the side JSON's",
            format_bytes(c),
            p.hardware.gpu.name,
            format_bytes(capacity)
        ));
    }
    let predicted_params = plan.memory.breakdown.steady[Category::Parameter];
    let traced_params = diagnosis.peak.as_ref().map_or(0, |pk| {
        pk.by_category
            .iter()
            .find(|(c, _)| *c == Category::Parameter)
            .map_or(0, |(_, b)| *b)
    });
    if traced_params == 0 {
        mismatches.push(format!(
            "the trace attributes no bytes to parameters, so the model's {} of parameters could not be checked against it",
            format_bytes(predicted_params)
        ));
    } else {
        let ratio = traced_params as f64 / predicted_params.max(1) as f64;
        if (ratio - 1.0).abs() > PARAMETER_TOLERANCE {
            mismatches.push(format!(
                "the trace holds {} of parameters at its peak, the side JSON's model ({} parameters at {}) {}: the model or the precision may not be the run's",
                format_bytes(traced_params),
                p.facts.total_params,
                side.strategy.precision,
                format_bytes(predicted_params)
            ));
        }
    }
    let traced_oom = diagnosis.fragmentation.caching.first_oom.is_some();
    if traced_oom && plan.fits {
        mismatches.push(format!(
            "the replay runs out of memory, but the planner predicts the stated strategy fits ({} of {} usable): the run holds more than the side JSON describes",
            format_bytes(plan.memory.per_device_peak_bytes),
            format_bytes(p.usable_device_bytes())
        ));
    }
    RunReport {
        model: side.model.clone(),
        parameters: p.facts.total_params,
        device: p.hardware.gpu.name.clone(),
        capacity_bytes: capacity,
        strategy: side.strategy,
        predicted_peak_bytes: plan.memory.per_device_peak_bytes,
        levers: rank(p, &side.strategy),
        mismatches,
    }
}
