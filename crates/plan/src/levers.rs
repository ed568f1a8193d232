//! The levers ranked for one run that ran out of memory: each memory lever applied alone to the
//! run's stated strategy and costed by the planner (its predicted peak per device and the bytes
//! it saves against the stated strategy), listed in the order of cost of the classic
//! out-of-memory guides, and the first of them that fits the device.
//!
//! The order is Hugging Face's "Methods and tools for efficient training on a single GPU"
//! (<https://huggingface.co/docs/transformers/perf_train_gpu_one>): a smaller batch with gradient
//! accumulation (same global batch, same numerics), gradient checkpointing (about a third more
//! compute), mixed precision, the optimizer's states (8-bit Adam), then DeepSpeed ZeRO (more
//! GPUs' memory, more communication) and offload (PCIe traffic every step).
//!
//! Not for: combining levers (see `search`, which finds the fastest combination that fits).

use crate::cost::{Problem, evaluate};
use crate::strategy::{Checkpoint, Offload, Optimizer, Precision, Strategy, ZeroStage};
use serde::Serialize;

/// One memory lever, in the guide's order of cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lever {
    /// The micro-batch divided by its smallest factor, accumulation multiplied by it.
    MicroBatch,
    /// Every block checkpointed (`--checkpoint all`).
    Checkpointing,
    /// fp32 → bf16 (or fp16) mixed precision; mixed → pure bf16.
    Precision,
    /// AdamW's states in 8 bits (bitsandbytes' AdamW8bit).
    EightBitStates,
    /// The next ZeRO/FSDP stage that fits (stage 3 when none does).
    Sharding,
    /// Optimizer states to host memory (ZeRO-Offload), then the parameters too.
    Offload,
}

impl Lever {
    /// Every lever, cheapest first.
    pub const ORDER: [Lever; 6] = [
        Lever::MicroBatch,
        Lever::Checkpointing,
        Lever::Precision,
        Lever::EightBitStates,
        Lever::Sharding,
        Lever::Offload,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Lever::MicroBatch => "smaller micro-batch, more accumulation",
            Lever::Checkpointing => "activation checkpointing",
            Lever::Precision => "lower precision",
            Lever::EightBitStates => "8-bit optimizer states",
            Lever::Sharding => "ZeRO/FSDP sharding",
            Lever::Offload => "offload",
        }
    }
}

/// One lever applied alone.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeverOutcome {
    pub lever: Lever,
    /// The stated strategy with this lever changed (`None`: it does not apply).
    pub strategy: Option<Strategy>,
    /// The change in `headroom plan`'s flags, or why the lever does not apply.
    pub change: String,
    /// Predicted bytes per device at the step's peak.
    pub peak_bytes: Option<u64>,
    /// Bytes saved against the stated strategy (negative: it needs more).
    pub saving_bytes: Option<i64>,
    /// Whether the plan fits the device (and the host, for offload).
    pub fits: bool,
}

/// The levers for one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeverRanking {
    pub stated: Strategy,
    pub stated_peak_bytes: u64,
    pub stated_fits: bool,
    /// Capacity × (1 − margin): what a plan may use per device.
    pub usable_bytes: u64,
    /// Every lever, in `Lever::ORDER`.
    pub levers: Vec<LeverOutcome>,
    /// The index in `levers` of the cheapest lever that fits alone.
    pub first_fit: Option<usize>,
}

/// The stated strategy with `lever` changed, and the change in words; `Err` says why the lever
/// does not apply.
pub fn apply(
    problem: &Problem,
    stated: &Strategy,
    lever: Lever,
) -> Result<(Strategy, String), String> {
    let mut s = *stated;
    let has_bf16 = problem.hardware.gpu.bf16_tflops > 0.0;
    let change = match lever {
        Lever::MicroBatch => {
            let m = stated.micro_batch;
            let Some(d) = (2..=m).find(|d| m.is_multiple_of(*d)) else {
                return Err("the micro-batch is already 1".into());
            };
            s.micro_batch = m / d;
            s.accumulation = stated.accumulation * d;
            format!(
                "--micro-batch {} --accumulation {}",
                s.micro_batch, s.accumulation
            )
        }
        Lever::Checkpointing => {
            if stated.checkpoint == Checkpoint::ALL_BLOCKS {
                return Err("every block is already checkpointed".into());
            }
            s.checkpoint = Checkpoint::ALL_BLOCKS;
            "--checkpoint all".into()
        }
        Lever::Precision => {
            s.precision = match (stated.precision, has_bf16) {
                (Precision::Fp32, true) => Precision::Bf16Mixed,
                (Precision::Fp32, false) => Precision::Fp16Mixed,
                (Precision::Bf16Mixed | Precision::Fp16Mixed, true) => Precision::Bf16,
                (Precision::Bf16Mixed | Precision::Fp16Mixed, false) => {
                    return Err(format!(
                        "{} is already mixed and {} has no bf16 for pure bf16",
                        stated.precision, problem.hardware.gpu.name
                    ));
                }
                (Precision::Bf16, _) => return Err("the run is already pure bf16".into()),
            };
            format!("--precision {}", s.precision)
        }
        Lever::EightBitStates => {
            match stated.optimizer {
                Optimizer::AdamW | Optimizer::AdamWBf16 => {}
                Optimizer::AdamW8bit | Optimizer::PagedAdamW8bit => {
                    return Err("the optimizer states are already 8-bit".into());
                }
                other => {
                    return Err(format!(
                        "8-bit states replace AdamW's, and the run uses {other}"
                    ));
                }
            }
            s.optimizer = Optimizer::AdamW8bit;
            "--optimizer adamw-8bit".into()
        }
        Lever::Sharding => {
            let now = stated.placement.zero_stage.number();
            if now == 3 {
                return Err("the run is already at stage 3".into());
            }
            let candidates: Vec<Strategy> = (now + 1..=3)
                .map(|n| {
                    let mut c = *stated;
                    c.placement.zero_stage = ZeroStage::new(n).expect("stages 1 to 3 exist");
                    c
                })
                .collect();
            s = candidates
                .iter()
                .copied()
                .find(|c| c.incompatibility().is_none() && evaluate(problem, c).fits)
                .unwrap_or(candidates[candidates.len() - 1]);
            format!("--zero {}", s.placement.zero_stage)
        }
        Lever::Offload => {
            let p = &mut s.placement;
            if !p.offload_optimizer.is_offloaded() {
                p.offload_optimizer = Offload::Cpu;
                if p.zero_stage.number() < 2 {
                    p.zero_stage = ZeroStage::new(2).expect("stage 2 exists");
                }
                format!("--offload-optimizer cpu --zero {}", p.zero_stage)
            } else if !p.offload_params.is_offloaded() {
                p.offload_params = Offload::Cpu;
                p.zero_stage = ZeroStage::new(3).expect("stage 3 exists");
                "--offload-params cpu --zero 3".into()
            } else {
                return Err("the optimizer states and parameters are already offloaded".into());
            }
        }
    };
    if let Some(why) = s.incompatibility() {
        return Err(format!("{change} cannot run here: {why}"));
    }
    Ok((s, change))
}

/// Each lever applied alone to `stated`, cheapest first, and the first that fits.
pub fn rank(problem: &Problem, stated: &Strategy) -> LeverRanking {
    let base = evaluate(problem, stated);
    let base_peak = base.memory.per_device_peak_bytes;
    let levers: Vec<LeverOutcome> = Lever::ORDER
        .into_iter()
        .map(|lever| match apply(problem, stated, lever) {
            Ok((s, change)) => {
                let plan = evaluate(problem, &s);
                let peak = plan.memory.per_device_peak_bytes;
                LeverOutcome {
                    lever,
                    strategy: Some(s),
                    change,
                    peak_bytes: Some(peak),
                    saving_bytes: Some(base_peak as i64 - peak as i64),
                    fits: plan.fits,
                }
            }
            Err(why) => LeverOutcome {
                lever,
                strategy: None,
                change: why,
                peak_bytes: None,
                saving_bytes: None,
                fits: false,
            },
        })
        .collect();
    let first_fit = levers.iter().position(|l| l.fits);
    LeverRanking {
        stated: *stated,
        stated_peak_bytes: base_peak,
        stated_fits: base.fits,
        usable_bytes: problem.usable_device_bytes(),
        levers,
        first_fit,
    }
}
