//! Time of one optimizer step.
//!
//! - Model FLOPs: `6·P_active·T` for the matmuls (forward 2, backward 4 per weight per token;
//!   TM101 "C ≈ 6PD") plus `12·s·q·T` per attention layer for QKᵀ and attention·V (Korthikanti
//!   et al. App. A: `72·B·L·s·h²·(s/6h)` = `12·B·L·s²·h`). P_active counts every dense projection
//!   including the LM head, MoE experts scaled by `k/E`; embedding lookups are not matmuls.
//! - Recompute FLOPs: the forward of every checkpointed block; for selective recomputation the
//!   core attention forward `4·s·q·T` per layer; for a chunked loss the output projection's
//!   forward `2·h·v·T`.
//! - Compute time: FLOPs / (N · dense peak of the precision · achieved efficiency). fp32 uses
//!   the fp32 peak (PyTorch disables TF32 matmuls by default). The achieved efficiency saturates
//!   with the work of one micro-batch, `w = tokens per micro-batch × hidden size`:
//!   `efficiency · w / (w + w½)`, with `w½ = half_saturation_work · √(peak / 15.7 TFLOP/s)`. Small
//!   micro-batches leave a GPU's SMs idle (NVIDIA's "Matrix Multiplication Background" guide:
//!   tile and wave quantisation) and pay each kernel's fixed latency once more per micro-batch,
//!   and a faster GPU needs more work to hide both (√ of its speed-up: fitted to the same guide's
//!   fp16 runs, which a proportional rule made 46 % slow at micro-batch 1). `w½` is fitted so that
//!   bert-large (hidden 1024, 512 tokens) on a V100 in fp32 runs micro-batch 1 × accumulation 4
//!   at 0.875× the samples/s of micro-batch 4, as Hugging Face measured (7.75 against 8.86).
//! - The matmuls' shape: a projection of width `h` does `2h` FLOPs per element it moves, an
//!   arithmetic intensity `I = h / e` FLOPs per byte, and a GPU is compute-bound only well above
//!   its roofline's ridge point (dense peak / memory bandwidth; Williams et al. 2009, "Roofline").
//!   The achieved efficiency is further scaled by `I / (I + κ·ridge)`: about 0.9 at Llama's
//!   4096–8192, much less at GPT-2's 768 (`shape_efficiency`). `κ` is fitted to nanoGPT's GPT-2
//!   run on 8 A100 (`HALF_EFFICIENCY_INTENSITY`).
//! - Naive attention moves its s² scores through HBM (written, softmax read+write, read by
//!   attention·V; about twice that in backward): `12·e·a·s²·b` bytes per layer and micro-batch
//!   over the memory bandwidth, not overlapped. Memory-efficient attention keeps them on chip.
//! - Element-wise kernels (norms, activations, residual adds, casts, the loss over the
//!   vocabulary) move bytes at the memory bandwidth, not overlapped with the matmuls; their
//!   bytes per token grow with the width `h` while the matmuls' FLOPs grow with `h²`, so they
//!   are a large part of a small model's step. `torch.compile` fuses them (`elementwise`).
//! - Optimizer step on the GPU: memory bound, reading and writing the local states; paged states
//!   cross PCIe twice, overlapped with the backward when the step runs in backward.
//! - The saturated efficiency is each GPU's and precision's (`efficiency`).
//! - Communication per step, in elements (ZeRO §7): DDP and stage 1 `2Ψ` (gradients reduced once
//!   per step under `no_sync`); stage 2 reduce-scatters every micro-batch `k·Ψ` and all-gathers
//!   `Ψ`; stage 3 `3Ψ` per micro-batch. Ring traffic per device is `volume·(N−1)/N` over the
//!   slowest link crossed. Gradient reduction overlaps the backward pass (⅔ of compute); stage 3
//!   prefetching overlaps the whole forward and backward; the stage 1–2 parameter all-gather
//!   after the step is exposed.
//! - Offload (ZeRO-Offload §4; ZeRO-Infinity): optimizer offload moves gradients to the host
//!   every micro-batch and parameters back once (PCIe, exposed), runs the step on the CPU at
//!   `cpu_optimizer_params_per_s` per node, and with NVMe reads and writes the states once per
//!   step; parameter offload fetches each parameter shard for forward and backward of every
//!   micro-batch, overlapped with compute by prefetching.
//!
//! Not for: memory (see `memory`).

use super::{Problem, activation, elementwise, memory};
use crate::strategy::{Attention, Checkpoint, Framework, Loss, Offload, Precision, Strategy};
use serde::Serialize;

/// Time of one optimizer step (all devices in parallel), as either evaluator predicts it: the
/// analytical model for any GPU here, the engine's measured speed model for a dry run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StepTime {
    pub step_s: f64,
    pub tokens_per_s: f64,
    /// Model FLOPs per step, all devices.
    pub model_flops: f64,
    /// Extra FLOPs of activation recomputation per step, all devices.
    pub recompute_flops: f64,
    /// Matmul and attention time.
    pub compute_s: f64,
    /// Memory-bound work: element-wise, norm, reduction and copy kernels (both models) and
    /// naive attention's s² traffic (analytical model).
    pub memory_bound_s: f64,
    /// Fixed cost of every kernel call (engine; 0 in the analytical model).
    pub kernel_overhead_s: f64,
    /// The optimizer step's memory traffic (analytical model; the engine counts it as
    /// memory-bound work).
    pub optimizer_s: f64,
    /// Communication not hidden behind compute.
    pub exposed_communication_s: f64,
    /// Offload traffic and CPU optimizer time not hidden behind compute.
    pub offload_s: f64,
    /// Collective traffic per device per step (ring), bytes.
    pub communication_bytes_per_device: f64,
    /// Model FLOPs utilisation: model FLOPs / (step time × N × peak).
    pub mfu: f64,
}

/// Dense peak FLOP/s of one GPU at a precision.
pub fn peak_flops(problem: &Problem, p: Precision) -> f64 {
    let g = &problem.hardware.gpu;
    let tflops = match p {
        Precision::Bf16Mixed | Precision::Bf16 => g.bf16_tflops,
        Precision::Fp16Mixed => g.fp16_tflops,
        Precision::Fp32 => g.fp32_tflops,
    };
    tflops * 1e12
}

/// The dense peak the half-saturation work is stated for: a V100's fp32 peak (NVIDIA V100
/// datasheet, SXM2), the GPU of the measurement it was fitted to.
pub const SATURATION_REFERENCE_TFLOPS: f64 = 15.7;

/// The matmul arithmetic intensity, in units of the GPU's ridge point, at which the matmuls reach
/// half their saturated efficiency: fitted so that nanoGPT's GPT-2 (hidden 768, compiled) runs
/// at 106,667 tokens/s per GPU on 8 A100 40GB (its README: 600,000 iterations of 491,520 tokens
/// in about 4 days), with the A100's saturated efficiency fitted to torchtitan's Llama 3 8B
/// (`tests/published_runs.rs` derives both).
pub const HALF_EFFICIENCY_INTENSITY: f64 = 2.4958;

/// Achieved fraction of the dense peak for micro-batches of `micro_batch` sequences at
/// precision `p`: the saturated efficiency scaled by the micro-batch's saturation `w / (w + w½)`
/// and by the matmuls' shape `I / (I + κ·ridge)` (see the module header).
pub fn achieved_efficiency(problem: &Problem, p: Precision, micro_batch: u64) -> f64 {
    let work = (micro_batch * problem.workload.seq_len * problem.spec.hidden_size) as f64;
    let half = problem.cost.half_saturation_work
        * (peak_flops(problem, p) / (SATURATION_REFERENCE_TFLOPS * 1e12)).sqrt();
    super::efficiency::saturated(problem, p) * work / (work + half) * shape_efficiency(problem, p)
}

/// The fraction of the saturated efficiency the model's matmul shapes allow: a projection of
/// width `h` over many tokens does `2h` FLOPs per element it reads or writes, an arithmetic
/// intensity `I = h / e` FLOPs per byte (`e` bytes per element); a GPU whose dense peak is
/// `ridge` times its memory bandwidth (its roofline's ridge point) is fed only when `I` is well
/// above the ridge, and reaches `I / (I + κ·ridge)` of its saturated efficiency.
pub fn shape_efficiency(problem: &Problem, p: Precision) -> f64 {
    let intensity = problem.spec.hidden_size as f64 / p.activation_bytes() as f64;
    let ridge = peak_flops(problem, p) / (problem.hardware.gpu.memory_bandwidth_gbps * 1e9);
    intensity / (intensity + problem.cost.half_efficiency_intensity * ridge)
}

/// Predicts the step time of `s` on `problem`.
pub fn predict(problem: &Problem, s: &Strategy) -> StepTime {
    let f = &problem.facts;
    let n = problem.hardware.world_size() as f64;
    let tokens = problem.workload.tokens_per_step() as f64;
    let (model_flops, recompute_flops) = flops(problem, s);
    let peak = peak_flops(problem, s.precision);
    let efficiency = achieved_efficiency(problem, s.precision, s.micro_batch);
    let compute_s = (model_flops + recompute_flops) / (n * peak * efficiency);
    let memory_bound_s = attention_traffic_s(problem, s)
        + elementwise::seconds(problem, s, recomputed_share(problem, s));
    let optimizer_s = optimizer_step_s(problem, s) + paging_s(problem, s, compute_s);

    let p = f.params as f64;
    let (pb, gb) = (
        s.precision.param_bytes() as f64,
        s.precision.grad_bytes() as f64,
    );
    let ring = if n > 1.0 { (n - 1.0) / n } else { 0.0 };
    let bw = problem.hardware.collective_bandwidth_gbps() * 1e9;
    let k = s.accumulation as f64;
    let (overlapped, exposed) = match s.placement.zero_stage.number() {
        0 | 1 => (2.0 * p * gb, 0.0),
        2 => (k * p * gb, p * pb),
        _ => (k * 3.0 * p * pb, 0.0),
    };
    let overlap_window = if s.placement.zero_stage.shards_parameters() {
        compute_s
    } else {
        compute_s * 2.0 / 3.0
    };
    let exposed_communication_s =
        (overlapped * ring / bw - overlap_window).max(0.0) + exposed * ring / bw;
    let offload_s = offload_s(problem, s, compute_s);

    let step_s = compute_s + memory_bound_s + optimizer_s + exposed_communication_s + offload_s;
    StepTime {
        step_s,
        tokens_per_s: tokens / step_s,
        model_flops,
        recompute_flops,
        compute_s,
        memory_bound_s,
        kernel_overhead_s: 0.0,
        optimizer_s,
        exposed_communication_s,
        offload_s,
        communication_bytes_per_device: (overlapped + exposed) * ring,
        mfu: model_flops / (step_s * n * peak),
    }
}

/// Model FLOPs of a step and the extra FLOPs of recomputation (all devices).
fn flops(problem: &Problem, s: &Strategy) -> (f64, f64) {
    let spec = &problem.spec;
    let f = &problem.facts;
    let seq = problem.workload.seq_len as f64;
    let tokens = problem.workload.tokens_per_step() as f64;
    let q = spec.q_dim() as f64;
    let attn_layers = f.attention_layers as f64;
    let attention_flops = 12.0 * seq * q * tokens * attn_layers;
    // Forward 2, backward 4 FLOPs per weight and token (input and weight gradients); a frozen
    // LoRA base computes only the input gradient (2), its adapters all three.
    let model_flops = match f.lora {
        None => 6.0 * f.active_matmul_params * tokens + attention_flops,
        Some(l) => {
            (4.0 * f.active_matmul_params + 6.0 * l.trainable as f64) * tokens + attention_flops
        }
    };
    let blocks = spec.total_blocks();
    let recompute_flops = match effective_policy(problem, s) {
        Checkpoint::None | Checkpoint::Budget(_) => 0.0,
        Checkpoint::Selective => 4.0 * seq * q * tokens * attn_layers,
        Checkpoint::SelectiveOp => {
            let op = activation::op_selective(
                spec,
                seq,
                1.0,
                activation::Width::of(problem.framework, s),
                s.attention,
            );
            let attention = match op.recomputes_attention {
                true => 4.0 * seq * q * tokens * attn_layers,
                false => 0.0,
            };
            2.0 * op.recomputed_weights * tokens * blocks as f64 + attention
        }
        policy @ (Checkpoint::EveryNth(_) | Checkpoint::Sqrt) => {
            let share = activation::checkpointed_blocks(policy, blocks) as f64 / blocks as f64;
            share * (2.0 * f.active_block_matmul_params * tokens + attention_flops / 3.0)
        }
    };
    // A chunked loss runs the output projection's forward again in backward.
    let loss_recompute = match s.loss {
        Loss::Plain => 0.0,
        Loss::Chunked(_) => 2.0 * spec.hidden_size as f64 * spec.vocab_size as f64 * tokens,
    };
    (model_flops, recompute_flops + loss_recompute)
}

/// The fraction of blocks whose forward runs again in backward (whole-block policies only).
fn recomputed_share(problem: &Problem, s: &Strategy) -> f64 {
    match effective_policy(problem, s) {
        policy @ (Checkpoint::EveryNth(_) | Checkpoint::Sqrt) => {
            let blocks = problem.spec.total_blocks();
            activation::checkpointed_blocks(policy, blocks) as f64 / blocks as f64
        }
        _ => 0.0,
    }
}

/// The checkpoint policy the model charges (`budget:SIZE` resolved).
fn effective_policy(problem: &Problem, s: &Strategy) -> Checkpoint {
    activation::effective_policy(
        &problem.spec,
        problem.workload.seq_len as f64,
        s.micro_batch as f64,
        activation::Width::of(problem.framework, s),
        s.attention,
        s.checkpoint,
        s.loss,
    )
}

/// Naive attention's s² traffic through device memory (re-read under selective recompute).
fn attention_traffic_s(problem: &Problem, s: &Strategy) -> f64 {
    if s.attention == Attention::MemoryEfficient {
        return 0.0;
    }
    let hbm = problem.hardware.gpu.memory_bandwidth_gbps * 1e9;
    let e = s.precision.activation_bytes() as f64;
    let seq = problem.workload.seq_len as f64;
    let a = problem.spec.num_heads as f64;
    let per_layer = 12.0 * e * a * seq * seq * s.micro_batch as f64;
    let recompute = match effective_policy(problem, s) {
        Checkpoint::Selective => 4.0 * e * a * seq * seq * s.micro_batch as f64,
        _ => 0.0,
    };
    (per_layer + recompute) * problem.facts.attention_layers as f64 * s.accumulation as f64 / hbm
}

/// Parameters each device's optimizer updates (its shard under ZeRO ≥ 1).
fn local_params(problem: &Problem, s: &Strategy) -> f64 {
    let p = problem.facts.params as f64;
    if s.placement.zero_stage.shards_optimizer() {
        p / problem.hardware.world_size() as f64
    } else {
        p
    }
}

/// Optimizer-state bytes of each device (its shard under ZeRO ≥ 1).
fn local_state_bytes(problem: &Problem, s: &Strategy) -> f64 {
    let shards = if s.placement.zero_stage.shards_optimizer() {
        problem.hardware.world_size() as f64
    } else {
        1.0
    };
    memory::optimizer_state_bytes(problem, s) / shards
}

/// The device-side optimizer step's memory traffic (none when the step runs on the host).
fn optimizer_step_s(problem: &Problem, s: &Strategy) -> f64 {
    if s.placement.offload_optimizer != Offload::None {
        return 0.0;
    }
    let local = local_params(problem, s);
    let state = local_state_bytes(problem, s);
    let (pb, gb) = (
        s.precision.param_bytes() as f64,
        s.precision.grad_bytes() as f64,
    );
    let bytes = 2.0 * (local * (pb + s.precision.master_bytes() as f64) + state) + local * gb;
    bytes / (problem.hardware.gpu.memory_bandwidth_gbps * 1e9)
}

/// Paged optimizer states cross PCIe twice a step (in for the update, out after it).
/// bitsandbytes prefetches the next tensor's pages on a side stream while the current one
/// updates: after backward that hides nothing (the updates are short), but with the step in
/// backward each block's pages move while the backward of the blocks before it computes, so
/// only what exceeds the backward's time (⅔ of compute) is exposed.
fn paging_s(problem: &Problem, s: &Strategy, compute_s: f64) -> f64 {
    if !s.optimizer.paged() || s.placement.offload_optimizer != Offload::None {
        return 0.0;
    }
    let crossing =
        2.0 * local_state_bytes(problem, s) / (problem.hardware.pcie_bandwidth_gbps * 1e9);
    match s.optimizer_in_backward {
        true => (crossing - compute_s * 2.0 / 3.0).max(0.0),
        false => crossing,
    }
}

/// Offload traffic and host optimizer time not hidden behind `compute_s`.
fn offload_s(problem: &Problem, s: &Strategy, compute_s: f64) -> f64 {
    let hw = &problem.hardware;
    let n = hw.world_size() as f64;
    let p = problem.facts.params as f64;
    let k = s.accumulation as f64;
    let (pb, gb) = (
        s.precision.param_bytes() as f64,
        s.precision.grad_bytes() as f64,
    );
    let local = local_params(problem, s);
    let pcie = hw.pcie_bandwidth_gbps * 1e9;
    let nvme = hw.nvme_bandwidth_gbps * 1e9;
    let per_node = hw.gpus_per_node as f64;
    let mut offload_s = 0.0;
    if s.placement.offload_optimizer != Offload::None {
        let gradients_down = k * gb * local / pcie;
        let parameters_up = pb * local / pcie;
        let host_step = per_node * local / hw.cpu_optimizer_params_per_s;
        offload_s += match problem.framework {
            // ZeRO-Offload's schedule (Ren et al. 2021, §4.1): each gradient bucket moves to the
            // host as backward produces it, overlapped with the backward still running (⅔ of
            // compute); DeepSpeedCPUAdam copies each updated tile's 16-bit parameters to the GPU
            // while it updates the next (`DeepSpeedCPUAdam.step(fp16_param_groups=…)`,
            // "Performing the copy here reduces communication time"), so the step costs the
            // longer of the two.
            Framework::DeepSpeed => {
                (gradients_down - compute_s * 2.0 / 3.0).max(0.0) + host_step.max(parameters_up)
            }
            // FSDP's CPU offload: charged one after the other (an upper bound: FSDP moves
            // gradients on its post-backward stream, but no published FSDP offload run with a
            // throughput was found to size the overlap against).
            Framework::Fsdp => gradients_down + parameters_up + host_step,
        };
        if s.placement.offload_optimizer == Offload::Nvme {
            let states = 4.0 * local + memory::optimizer_state_bytes(problem, s) / n;
            offload_s += 2.0 * per_node * states / nvme;
        }
    }
    if s.placement.offload_params != Offload::None {
        let fetch = 2.0 * k * pb * p / n;
        let mut t = fetch / pcie;
        if s.placement.offload_params == Offload::Nvme {
            t = t.max(per_node * fetch / nvme);
        }
        offload_s += (t - compute_s).max(0.0);
    }
    // Offloaded checkpoint inputs cross PCIe twice a micro-batch, out in forward and back in
    // backward; DeepSpeed's cpu_checkpointing copies them synchronously, so none of it hides.
    let activations = memory::offloaded_activation_bytes(problem, s).host;
    offload_s += 2.0 * k * activations * problem.cost.activation_scale / pcie;
    offload_s
}
