//! Calibration (`headroom plan --calibrate FILE`): rescale the cost model to one measured
//! training step of the same model on the same hardware, from any framework.
//!
//! The file is a small JSON object (documented in `docs/planner.md`):
//!
//! ```json
//! { "strategy": { "precision": "bf16-mixed", "optimizer": "adamw", "zero_stage": 0,
//!                 "offload_optimizer": "none", "offload_params": "none", "checkpoint": "none",
//!                 "attention": "memory-efficient", "micro_batch": 4, "accumulation": 1 },
//!   "seq_len": 2048, "tokens_per_s": 3900.0, "peak_allocated_bytes": 61000000000,
//!   "source": "torchtune full_finetune_single_device, 2026-11-30" }
//! ```
//!
//! `tokens_per_s` is for the whole run (all GPUs). `seq_len` defaults to the plan's.
//! `peak_allocated_bytes` (optional) is one GPU's peak of allocated tensor bytes, as PyTorch's
//! `torch.cuda.max_memory_allocated()` reports it: no CUDA context, no allocator cache.
//!
//! - **Speed.** The measured step time minus the parts the efficiency does not scale (memory-
//!   bound attention traffic and element-wise kernels, the optimizer step, exposed
//!   communication and offload) is the
//!   compute time the run achieved; the saturated efficiency is scaled so the model predicts
//!   exactly the measured tokens/s for the measured strategy (iterated, because overlapped
//!   communication depends on the compute time). The saturation with micro-batch and the
//!   matmul shape's factor keep their form, so other micro-batches and models move with it.
//! - **Memory.** When the measured step peaks in forward/backward, the activation bytes are
//!   scaled so the predicted allocated bytes (the peak less the CUDA context and fragmentation
//!   reserve of `other`) equal the measurement; model states are exact counts and keep theirs.
//!   A peak in the optimizer step holds no activations, so it calibrates nothing and says so.
//!
//! Not for: choosing the plan (`search`) or the default constants (`cost`).

use crate::cost::memory::Phase;
use crate::cost::{CostModel, Problem, efficiency, evaluate};
use crate::error::{PlanError, Result};
use crate::strategy::{Category, Strategy};
use crate::workload::{BatchSpec, Workload};
use serde::{Deserialize, Serialize};

/// One measured training step.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measurement {
    /// The levers the measured run used.
    pub strategy: Strategy,
    /// Tokens per sequence; the plan's when absent.
    #[serde(default)]
    pub seq_len: Option<u64>,
    /// Training throughput of the whole run (all GPUs).
    pub tokens_per_s: f64,
    /// Peak allocated tensor bytes on one GPU.
    #[serde(default)]
    pub peak_allocated_bytes: Option<u64>,
    /// Where the figures come from (free text, echoed in the report).
    #[serde(default)]
    pub source: Option<String>,
}

/// What calibration changed, for the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Calibration {
    pub source: Option<String>,
    pub measured_tokens_per_s: f64,
    /// The default model's prediction for the measured strategy.
    pub predicted_tokens_per_s: f64,
    pub efficiency_before: f64,
    pub efficiency_after: f64,
    pub measured_peak_allocated_bytes: Option<u64>,
    pub predicted_peak_allocated_bytes: u64,
    /// 1.0 when the memory was not calibrated.
    pub activation_scale: f64,
    /// Why the memory was not calibrated, when it was not.
    pub memory_note: Option<String>,
}

impl Measurement {
    /// Parses a calibration file's text.
    pub fn from_json(text: &str) -> Result<Measurement> {
        serde_json::from_str(text).map_err(|e| PlanError::Calibration(format!("{e}")))
    }
}

fn refuse(why: String) -> PlanError {
    PlanError::Calibration(why)
}

/// The cost model of `problem` rescaled to `m`, and what changed.
pub fn calibrate(problem: &Problem, m: &Measurement) -> Result<(CostModel, Calibration)> {
    if !(m.tokens_per_s.is_finite() && m.tokens_per_s > 0.0) {
        return Err(refuse(format!(
            "tokens_per_s {} must be a positive number",
            m.tokens_per_s
        )));
    }
    if let Some(why) = m.strategy.incompatibility() {
        return Err(refuse(format!("the measured strategy cannot run: {why}")));
    }
    let s = &m.strategy;
    let seq_len = m.seq_len.unwrap_or(problem.workload.seq_len);
    let workload = Workload::new(
        &problem.spec,
        seq_len,
        BatchSpec::Split {
            micro_batch: s.micro_batch,
            accumulation: s.accumulation,
        },
        Some(s.micro_batch),
        Some(s.accumulation),
        problem.hardware.world_size(),
    )?;
    let measured = Problem {
        workload,
        ..problem.clone()
    };
    let before = evaluate(&measured, s);
    let measured_step_s = measured.workload.tokens_per_step() as f64 / m.tokens_per_s;
    // Communication and offload overlap with compute, so the parts the efficiency does not
    // scale depend on it a little: iterate to the fixed point (a few rounds at most).
    let mut cost = problem.cost;
    let mut t = before.time;
    for _ in 0..32 {
        let fixed_s = t.step_s - t.compute_s;
        let compute_s = measured_step_s - fixed_s;
        if compute_s <= 0.0 {
            return Err(refuse(format!(
                "the measured step ({measured_step_s:.4} s) is shorter than the time the model gives its memory-bound work, optimizer step and communication alone ({fixed_s:.4} s): the hardware or the strategy in the file does not describe this run"
            )));
        }
        cost.efficiency_scale *= t.compute_s / compute_s;
        let saturated = efficiency::saturated(
            &Problem {
                cost,
                ..measured.clone()
            },
            s.precision,
        );
        if saturated > 1.0 {
            return Err(refuse(format!(
                "{:.0} tokens/s would need {:.0} % of the GPUs' dense peak: check the GPU, the precision and the GPU count against the measured run",
                m.tokens_per_s,
                100.0 * saturated
            )));
        }
        t = evaluate(
            &Problem {
                cost,
                ..measured.clone()
            },
            s,
        )
        .time;
        if (t.step_s - measured_step_s).abs() <= 1e-12 * measured_step_s {
            break;
        }
    }

    let at_peak = &before.memory.breakdown.at_peak;
    let predicted_allocated = at_peak.total() - at_peak[Category::Other];
    let (activation_scale, memory_note) = match m.peak_allocated_bytes {
        None => (1.0, None),
        Some(_) if before.memory.peak_phase == Phase::OptimizerStep => (
            1.0,
            Some("the measured strategy peaks in the optimizer step, which holds no activations: memory left as predicted".into()),
        ),
        Some(peak) => {
            let activation = at_peak[Category::Activation] as f64;
            let rest = (predicted_allocated - at_peak[Category::Activation]) as f64;
            if activation == 0.0 || (peak as f64) <= rest {
                return Err(refuse(format!(
                    "peak_allocated_bytes {peak} is not above the model states, workspace and inputs the strategy holds anyway ({rest:.0} B): the model, sequence length or strategy in the file does not describe this run"
                )));
            }
            ((peak as f64 - rest) / activation, None)
        }
    };
    cost.activation_scale *= activation_scale;
    Ok((
        cost,
        Calibration {
            source: m.source.clone(),
            measured_tokens_per_s: m.tokens_per_s,
            predicted_tokens_per_s: before.time.tokens_per_s,
            efficiency_before: efficiency::saturated(problem, s.precision),
            efficiency_after: efficiency::saturated(
                &Problem {
                    cost,
                    ..problem.clone()
                },
                s.precision,
            ),
            measured_peak_allocated_bytes: m.peak_allocated_bytes,
            predicted_peak_allocated_bytes: predicted_allocated,
            activation_scale,
            memory_note,
        },
    ))
}
