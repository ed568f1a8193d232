//! The analytical cost model as an evaluator of the search: which values are worth trying on
//! this hardware (bf16 only where the GPU has it; fp16-mixed only where it lacks bf16; on one
//! GPU, ZeRO stages only where offload needs them), and every strategy costed in microseconds,
//! so the search evaluates all of them.
//!
//! Not for: the search itself (see `search`).

use super::{Plan, Problem, evaluate};
use crate::error::PlanError;
use crate::search::{Evaluator, Space, in_backward_values};
use crate::strategy::{
    Attention, Checkpoint, Framework, Loss, Offload, Optimizer, Pins, Placement, Precision,
    Strategy, ZeroStage,
};

/// Checkpoint policies tried when not pinned.
const CHECKPOINTS: [Checkpoint; 5] = [
    Checkpoint::None,
    Checkpoint::Selective,
    Checkpoint::EveryNth(4),
    Checkpoint::EveryNth(2),
    Checkpoint::ALL_BLOCKS,
];

impl Evaluator for Problem {
    type Error = PlanError;

    fn space(&self, pins: &Pins) -> Result<Space, PlanError> {
        let hw = &self.hardware;
        let world = hw.world_size();
        let has_bf16 = hw.gpu.bf16_tflops > 0.0;
        if let Some(p) = pins.precision.filter(|p| p.needs_bf16())
            && !has_bf16
        {
            return Err(PlanError::Incompatible(format!(
                "--precision {p} needs bf16 support, which {} lacks; accepted: fp16-mixed, fp32",
                hw.gpu.name
            )));
        }
        if pins.optimizer_in_backward == Some(true) && world > 1 {
            return Err(PlanError::Incompatible(format!(
                "--optimizer-in-backward runs each block's update in backward on a single GPU \
                 (torchtune's optimizer_in_bwd); {world} GPUs would sum every gradient over the \
                 ranks first: plan for one GPU, or drop the flag"
            )));
        }
        if self.framework == Framework::Fsdp {
            fsdp_offload_pins(pins)?;
        }
        let precisions = Precision::ALL
            .iter()
            .copied()
            .filter(|p| has_bf16 || !p.needs_bf16())
            // fp16-mixed only where bf16 is missing: same memory and speed, less robust.
            .filter(|p| !has_bf16 || *p != Precision::Fp16Mixed || pins.precision.is_some())
            .collect();
        let mut placements = Vec::new();
        for zero_stage in ZeroStage::ALL {
            for offload_optimizer in Offload::ALL.iter().copied() {
                for offload_params in Offload::ALL.iter().copied() {
                    // One GPU: ZeRO stages without offload all equal stage 0; keep stage 0
                    // plain, stage 2 for optimizer offload, stage 3 for parameter offload,
                    // unless the user pinned the stage.
                    let wanted = if offload_params.is_offloaded() {
                        3
                    } else if offload_optimizer.is_offloaded() {
                        2
                    } else {
                        0
                    };
                    if world == 1 && pins.zero_stage.is_none() && zero_stage.number() != wanted {
                        continue;
                    }
                    // A LoRA run's model states beyond the frozen base are the adapters' few
                    // MiB: offloading them saves nothing worth a PCIe round trip, and a 4-bit
                    // base cannot be offloaded by the frameworks planned for. Searched only
                    // when pinned.
                    let offloaded =
                        offload_optimizer.is_offloaded() || offload_params.is_offloaded();
                    let pinned = pins.offload_optimizer.is_some() || pins.offload_params.is_some();
                    if self.workload.lora.is_some() && offloaded && !pinned {
                        continue;
                    }
                    // FSDP's only offload moves parameters, gradients and the optimizer step
                    // to the host together, under full sharding; it has no NVMe tier.
                    let fsdp_offload = offload_optimizer == Offload::Cpu
                        && offload_params == Offload::Cpu
                        && zero_stage.shards_parameters();
                    if self.framework == Framework::Fsdp && offloaded && !fsdp_offload {
                        continue;
                    }
                    // Activation offload is host memory or nothing (Placement::incompatibility).
                    for offload_activations in pins
                        .offload_activations
                        .map_or(vec![Offload::None, Offload::Cpu], |o| vec![o])
                    {
                        placements.push(Placement {
                            zero_stage,
                            offload_optimizer,
                            offload_params,
                            offload_activations,
                        });
                    }
                }
            }
        }
        let splits = self.workload.splits(world);
        if splits.is_empty() {
            return Err(PlanError::Batch(
                "no micro-batch × accumulation split matches the pinned values".into(),
            ));
        }
        Ok(Space {
            precisions,
            optimizers: Optimizer::ALL.to_vec(),
            placements,
            checkpoints: pins.checkpoint.map_or(CHECKPOINTS.to_vec(), |c| vec![c]),
            attentions: Attention::ALL.to_vec(),
            losses: pins.loss.map_or(Loss::SEARCHED.to_vec(), |l| vec![l]),
            in_backward: in_backward_values(pins, world),
            splits,
        })
    }

    fn evaluate(&self, strategy: &Strategy) -> Result<Plan, PlanError> {
        Ok(evaluate(self, strategy))
    }

    fn exhaustive(&self) -> bool {
        true
    }

    /// Selective recomputation only drops the s² scores naive attention keeps: with
    /// memory-efficient attention it saves nothing (unless SDPA runs its math path, which
    /// keeps them), so it is tried only when pinned.
    fn worth_trying(&self, s: &Strategy, pins: &Pins) -> bool {
        !(s.checkpoint == Checkpoint::Selective
            && super::sdpa::as_run(self, s).1.attention == Attention::MemoryEfficient
            && pins.checkpoint.is_none())
    }
}

/// Offload pins FSDP cannot run, refused with what it can (PyTorch's `CPUOffload`: parameters,
/// gradients and the optimizer step on the host, under FULL_SHARD; no NVMe tier).
fn fsdp_offload_pins(pins: &Pins) -> Result<(), PlanError> {
    let (opt, par) = (pins.offload_optimizer, pins.offload_params);
    let nvme = opt == Some(Offload::Nvme) || par == Some(Offload::Nvme);
    // One side offloaded and the other pinned on the device.
    let mismatched = matches!(
        (opt, par),
        (Some(Offload::Cpu), Some(Offload::None)) | (Some(Offload::None), Some(Offload::Cpu))
    );
    let below_3 = pins.zero_stage.is_some_and(|z| !z.shards_parameters());
    let cpu = opt == Some(Offload::Cpu) || par == Some(Offload::Cpu);
    if nvme || mismatched || (cpu && below_3) {
        return Err(PlanError::Incompatible(
            "--framework fsdp offloads only parameters, gradients and the optimizer step \
             together, to the CPU, under full sharding (CPUOffload(offload_params=True)); \
             pin --offload-optimizer cpu --offload-params cpu (with --zero 3 or unpinned), \
             or plan with --framework deepspeed for optimizer-only or NVMe offload"
                .into(),
        ));
    }
    Ok(())
}
