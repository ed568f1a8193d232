//! Model states of one device (parameters, gradients, master weights, optimizer states) and
//! what of them is offloaded to the host or NVMe.
//!
//! Model states follow the ZeRO paper's accounting (Rajbhandari et al. 2020, arXiv:1910.02054,
//! §3.1 and §5; docs/sources.md §1): with Ψ parameters, mixed-precision Adam keeps 2Ψ of
//! 16-bit parameters, 2Ψ of 16-bit gradients and K = 12 bytes per parameter of fp32 master
//! weights (4) and momentum + variance (8); stage 1 divides master + optimizer states by N_d,
//! stage 2 also the gradients, stage 3 also the parameters. Other optimizers change K
//! (docs/sources.md §10); the bytes per element come from the vocabulary's `Precision`.
//!
//! Gradient accumulation over micro-batches in f32 (DeepSpeed's `grad_accum_dtype`, fp32 by
//! default for bf16; headroom's engine for both 16-bit formats): under the DeepSpeed layout
//! with 16-bit gradients and accumulation > 1, a step also holds 4 bytes per parameter of f32
//! sums from its first micro-batch to its update — every parameter's below ZeRO-2, the rank's
//! shard under ZeRO-2/3, none under ZeRO-2/3 with optimizer offload (the host's gradient
//! partition is f32 already). Accumulation 1 and fp32 gradients hold none.
//!
//! Not for: the buffers and temporaries beside the states (see `buffers`) or activations.

use crate::cost::{Problem, gather};
use crate::strategy::{Framework, Offload, Optimizer, Strategy};

/// DeepSpeed `offload_param` defaults: `buffer_count` 5 × `buffer_size` 1e8 elements.
const PARAM_NVME_STAGING_ELEMENTS: f64 = 5.0 * 1e8;
/// NVMe optimizer staging: DeepSpeed `offload_optimizer.buffer_count` 4 × a sub-group of at most
/// 1e8 elements (the `sub_group_size` the DeepSpeed export writes) in fp32.
const OPT_NVME_SUB_GROUP: f64 = 1e8;

/// Bytes of the full (unsharded) optimizer state.
pub fn optimizer_state_bytes(problem: &Problem, s: &Strategy) -> f64 {
    let p = problem.facts.params as f64;
    // Full-size states take the format of the weights the optimizer updates (fp32 master
    // weights under mixed precision and fp32, bf16 under pure bf16), or bf16 for adamw-bf16.
    let state_bytes = s.optimizer.state_format(s.precision).bytes() as f64;
    match s.optimizer {
        Optimizer::Sgd
        | Optimizer::SgdMomentum
        | Optimizer::AdamW
        | Optimizer::AdamWBf16
        | Optimizer::Lamb => {
            let states = s.optimizer.states_per_param().unwrap_or(0) as f64;
            states * p * state_bytes
        }
        // uint8 m and v plus one fp32 absmax per block of 256 per state (Dettmers et al. 2022;
        // bitsandbytes' block since v0.44, the engine's too; docs/sources.md §16).
        Optimizer::AdamW8bit | Optimizer::PagedAdamW8bit => {
            2.0 * p + 2.0 * 4.0 * (p / 256.0).ceil()
        }
        // Factored second moment in fp32 (Shazeer & Stern 2018), no first moment by default.
        Optimizer::Adafactor => problem.facts.adafactor_state_elements as f64 * 4.0,
    }
}

/// Device bytes of the four model-state categories during forward/backward.
pub fn model_state_bytes(problem: &Problem, s: &Strategy) -> u64 {
    let states = ModelStates::of(problem, s);
    (states.param_device
        + states.gathered_params
        + states.grad_device
        + states.grad_unit
        + states.grad_sums
        + states.master_device
        + states.opt_device)
        .round() as u64
}

/// Model states of one device, and what is offloaded.
pub(super) struct ModelStates {
    pub(super) param_device: f64,
    pub(super) gathered_params: f64,
    pub(super) grad_device: f64,
    pub(super) grad_unit: f64,
    /// f32 sums of 16-bit gradients over a step's micro-batches (module header).
    pub(super) grad_sums: f64,
    pub(super) master_device: f64,
    pub(super) opt_device: f64,
    pub(super) host_per_rank: f64,
    pub(super) nvme_per_rank: f64,
}

impl ModelStates {
    pub(super) fn of(problem: &Problem, s: &Strategy) -> ModelStates {
        let f = &problem.facts;
        let n = problem.hardware.world_size() as f64;
        let p = f.params as f64;
        let (pb, gb, mb) = (
            s.precision.param_bytes() as f64,
            s.precision.grad_bytes() as f64,
            s.precision.master_bytes() as f64,
        );
        let shard = |bytes: f64, sharded: bool| if sharded { (bytes / n).ceil() } else { bytes };
        let opt_off = s.placement.offload_optimizer != Offload::None;
        let par_off = s.placement.offload_params != Offload::None;

        // A LoRA base is frozen: parameters only, in the dtype it was loaded in (by default the
        // parameter dtype) or NF4 (QLoRA). NF4's quantisation state is no parameter: sharding
        // and parameter offload move the codes only, and every rank keeps the whole state on
        // its device (`lora::nf4_state_bytes`).
        let (base_width, _) = problem.lora_base_widths(s);
        let frozen = f
            .lora
            .map_or(0.0, |l| l.frozen_sharded_bytes(base_width) as f64);
        let nf4_state = f.lora.map_or(0.0, |l| l.frozen_nf4_state_bytes as f64);
        // PyTorch's mixed precision (autocast, FSDP's `MixedPrecision`) trains fp32 parameters
        // with fp32 gradients: the parameters are the master copy, and there is no other.
        let torch_mixed = problem.framework == Framework::Fsdp && s.precision.master_weights();
        let (stored_pb, stored_gb, mb) = match torch_mixed {
            true => (4.0, 4.0, 0.0),
            false => (pb, gb, mb),
        };
        let param_local = shard(
            p * stored_pb + frozen,
            s.placement.zero_stage.shards_parameters(),
        ) + nf4_state;
        // With the step in backward each parameter's gradient is freed once applied
        // (torchtune's optimizer_in_bwd hooks): about the largest tensor's at a time.
        let grad_local = match s.optimizer_in_backward {
            true => f.largest_layer_params as f64 * stored_gb,
            false => shard(p * stored_gb, s.placement.zero_stage.shards_gradients()),
        };
        let master_local = shard(p * mb, s.placement.zero_stage.shards_optimizer());
        let shards_grads = s.placement.zero_stage.shards_gradients();
        let grad_sums = match problem.framework == Framework::DeepSpeed
            && stored_gb < 4.0
            && s.accumulation > 1
            && !(shards_grads && opt_off)
        {
            true => shard(p * 4.0, shards_grads),
            false => 0.0,
        };
        let opt_local = shard(
            optimizer_state_bytes(problem, s),
            s.placement.zero_stage.shards_optimizer(),
        );

        // Full sharding holds gathered parameters and one unit's unsharded gradient in the
        // compute dtype (`gather`). Below it, PyTorch's mixed precision computes with 16-bit
        // copies of the fp32 weights, held from forward to backward: autocast's cast of every
        // matmul weight under DDP, FSDP's gathered 16-bit model under SHARD_GRAD_OP.
        let (gathered, unsharded_grad) = gather::gathered(problem, s);
        let cast_copies = match (torch_mixed, s.placement.zero_stage.number()) {
            (true, 0 | 1) => f.active_matmul_params.min(p) * pb,
            (true, 2) => p * pb,
            _ => 0.0,
        };
        let (gathered_params, grad_unit) = (gathered + cast_copies, unsharded_grad * gb);

        let mut host = 0.0;
        let mut nvme = 0.0;
        if opt_off {
            // ZeRO-Offload: fp32 master copy, optimizer states and fp32 gradients on the host
            // (DeepSpeed memory docs: "4 bytes per gradient for nearly the entire set of weights").
            let local = p / if s.placement.zero_stage.shards_optimizer() {
                n
            } else {
                1.0
            };
            // fp32 master weights and states, and the fp32 gradient partition: on the host,
            // or swapped to NVMe with them sub-group by sub-group (DeepSpeed's
            // PartitionedOptimizerSwapper swaps a sub-group's gradients with its states).
            let states = 4.0 * local + opt_local + 4.0 * local;
            if s.placement.offload_optimizer == Offload::Nvme {
                nvme += states;
                host += 4.0 * local.min(OPT_NVME_SUB_GROUP) * 4.0;
            } else {
                host += states;
            }
        }
        if par_off {
            let local = ((p * pb + frozen) / n).ceil();
            if s.placement.offload_params == Offload::Nvme {
                nvme += local;
                host += PARAM_NVME_STAGING_ELEMENTS * pb;
            } else {
                host += local;
            }
        }
        // Paged states live on the host; the device holds one gather unit's (a block's) while
        // it is updated.
        let opt_local = if s.optimizer.paged() && !opt_off {
            host += opt_local;
            let unit = (f.gather_unit_params as f64).min(p);
            opt_local * unit / p.max(1.0)
        } else {
            opt_local
        };
        ModelStates {
            param_device: if par_off { nf4_state } else { param_local },
            gathered_params,
            grad_device: if opt_off { 0.0 } else { grad_local },
            grad_unit,
            grad_sums,
            master_device: if opt_off { 0.0 } else { master_local },
            opt_device: if opt_off { 0.0 } else { opt_local },
            host_per_rank: host,
            nvme_per_rank: nvme,
        }
    }
}
