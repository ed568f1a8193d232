//! The saturated efficiency of each GPU and precision: the fraction of the dense datasheet peak a
//! training step's matmuls reach once micro-batches fill the GPU. One number for every GPU (the
//! planner's first model, 0.45) made a V100's fp16 6.4× its fp32 where 2.1× is measured and an
//! H100 3.2× an A100 where about 1.9× is published: tensor cores outrun the memory-bound rest
//! of a step, and the newer the GPU the smaller the fraction of its peak a framework reaches.
//!
//! Each value is fitted to one published run by `headroom plan --calibrate` (the run's
//! strategy and tokens/s; `docs/planner.md`, "Speed"), so the model reproduces that run
//! exactly; the other published runs on the same GPU check it (`tests/published_runs.rs`).
//! GPUs without a published run take the value of their architecture's fitted GPU (Hopper's
//! H100, Ada's RTX 4090), the rest — Ampere's GA10x cards, B200, MI300X, fp32 beyond the V100 —
//! the default: no run of theirs was found to fit them to.
//!
//! The values are the efficiency of matmuls of unbounded arithmetic intensity: the step's
//! matmuls reach them times the micro-batch's saturation and times their shape's factor
//! (`time::shape_efficiency`: 0.84 for Llama 3 8B on an A100 80GB, 0.43 for GPT-2 on an A100
//! 40GB), which is why they lie above the runs' MFU.
//!
//! Not for: the micro-batch saturation (`time::achieved_efficiency`), the matmuls' shape
//! (`time::shape_efficiency`) or a user's own measurement (`calibrate`).

use super::Problem;
use crate::strategy::Precision;

/// Default saturated efficiency for GPUs without a published run (Korthikanti et al. 2022 report
/// 41–56 % MFU on A100s with Megatron-LM).
pub const DEFAULT_EFFICIENCY: f64 = 0.45;

/// Which peak a precision's matmuls run at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    /// fp32 on the CUDA cores (PyTorch keeps TF32 off for matmuls by default).
    Fp32,
    /// bf16/fp16 on the tensor cores.
    Tensor,
}

/// (GPU presets, unit, saturated efficiency, the published run it is fitted to).
const FITTED: &[(&[&str], Unit, f64, &str)] = &[
    (
        &["V100-16GB", "V100-32GB"],
        Unit::Fp32,
        0.8188,
        "Hugging Face single-GPU guide: bert-large-uncased, fp32, micro-batch 4 on a V100, 8.86 samples/s",
    ),
    (
        &["V100-16GB", "V100-32GB"],
        Unit::Tensor,
        0.3544,
        "Hugging Face single-GPU guide: bert-large-uncased, fp16 AMP, micro-batch 4 on a V100, 18.64 samples/s",
    ),
    (
        &["A100-40GB", "A100-80GB"],
        Unit::Tensor,
        0.7698,
        "torchtitan docs/performance.md: Llama 3 8B on 64 A100 80GB, FSDP, local batch 1, selective op checkpointing, 2,973 tokens/s per GPU",
    ),
    (
        // Hopper: the H100 SXM's fit, for the PCIe and NVL cards and the H200 too.
        &["H100-80GB", "H100-PCIe", "H100-NVL", "H200-141GB"],
        Unit::Tensor,
        0.6237,
        "torchtitan benchmarks/llama3_h100_202412: Llama 3.1 8B on 8 H100, FSDP, local batch 2, selective op checkpointing, 5,762 tokens/s per GPU",
    ),
    (
        // Ada: the RTX 4090's fit, for the L40S and the L4 too.
        &["RTX-4090", "L40S", "L4"],
        Unit::Tensor,
        0.9165,
        "torchtune README: Llama 3.1 8B full fine-tune on one RTX 4090 (paged 8-bit AdamW, step in backward, checkpointing, compiled), 1,650 tokens/s",
    ),
];

/// The fitted entry for `gpu` at `precision`, if a published run gives one.
pub fn fitted(gpu: &str, precision: Precision) -> Option<(f64, &'static str)> {
    let unit = match precision {
        Precision::Fp32 => Unit::Fp32,
        _ => Unit::Tensor,
    };
    FITTED
        .iter()
        .find(|(gpus, u, _, _)| *u == unit && gpus.contains(&gpu))
        .map(|&(_, _, value, source)| (value, source))
}

/// The saturated efficiency the model charges for `precision` on the problem's GPU: the
/// `--efficiency` override, else the fitted value, else the default; times the calibration
/// scale.
pub fn saturated(problem: &Problem, precision: Precision) -> f64 {
    let base = problem.cost.efficiency.unwrap_or_else(|| {
        fitted(&problem.hardware.gpu.name, precision).map_or(DEFAULT_EFFICIENCY, |(v, _)| v)
    });
    base * problem.cost.efficiency_scale
}
