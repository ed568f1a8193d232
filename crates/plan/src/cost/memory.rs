//! Device, host and NVMe bytes of one strategy, per `Category`, at the step's peak.
//!
//! Model states follow the ZeRO paper's accounting (Rajbhandari et al. 2020, arXiv:1910.02054,
//! §3.1 and §5; docs/sources.md §1): with Ψ parameters, mixed-precision Adam keeps 2Ψ of
//! 16-bit parameters, 2Ψ of 16-bit gradients and K = 12 bytes per parameter of fp32 master
//! weights (4) and momentum + variance (8); stage 1 divides master + optimizer states by N_d,
//! stage 2 also the gradients, stage 3 also the parameters. Other optimizers change K
//! (docs/sources.md §10); the bytes per element come from the vocabulary's `Precision`.
//!
//! A step has two candidate peaks, and the larger one is reported:
//! - forward/backward: model states + activations (held at the start of backward) + transient
//!   workspace (logits gradient, naive-attention backward scores) + inputs + buffers;
//! - optimizer step: model states + the optimizer's temporaries (PyTorch `foreach` AdamW holds
//!   one copy of the parameters being updated in the states' format, the `_foreach_sqrt` of the
//!   variance; torchtune PR #389; docs/sources.md §10), no activations.
//!
//! Gradient accumulation over micro-batches in f32 (DeepSpeed's `grad_accum_dtype`, fp32 by
//! default for bf16; headroom's engine for both 16-bit formats): under the DeepSpeed layout
//! with 16-bit gradients and accumulation > 1, a step also holds 4 bytes per parameter of f32
//! sums from its first micro-batch to its update — every parameter's below ZeRO-2, the rank's
//! shard under ZeRO-2/3, none under ZeRO-2/3 with optimizer offload (the host's gradient
//! partition is f32 already). Accumulation 1 and fp32 gradients hold none.
//!
//! `Other` holds the CUDA context (hardware field) plus the fragmentation reserve, a fraction of
//! everything else allocated.
//!
//! Not for: step time (see `time`).

use super::{Problem, activation, backward, gather};
use crate::strategy::{
    Attention, Framework, LossImpl, Offload, Optimizer, OptimizerImpl, Strategy,
};
use headroom_memory::{Category, CategoryBytes, MemoryBreakdown};
use serde::Serialize;

/// Which part of the step sets the peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    ForwardBackward,
    OptimizerStep,
}

/// Predicted memory of one strategy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryPrediction {
    /// Bytes per device at the peak; equals the sum of the breakdown at the peak.
    pub per_device_peak_bytes: u64,
    /// Bytes per category per device at the peak and between steps (model states, buffers,
    /// context).
    #[serde(flatten)]
    pub breakdown: MemoryBreakdown,
    pub peak_phase: Phase,
    pub capacity_bytes: u64,
    pub usable_bytes: u64,
    /// Host RAM per node for offloaded states, fp32 gradients and staging buffers, and each
    /// rank's data loader when the workload gives one.
    pub host_bytes_per_node: u64,
    /// NVMe bytes per node for states offloaded to disk.
    pub nvme_bytes_per_node: u64,
}

/// PyTorch DDP's default `bucket_cap_mb` (25 MiB); two buckets in flight.
const DDP_BUCKET_BYTES: f64 = 25.0 * 1024.0 * 1024.0;
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

/// Host bytes of one rank's data loader (staging buffers and workers), when the workload
/// gives one.
fn loader_host_bytes(problem: &Problem, s: &Strategy) -> f64 {
    let w = &problem.workload;
    w.loader
        .map_or(0.0, |l| l.host_bytes(s.micro_batch, w.seq_len) as f64)
}

/// Model states of one device, and what is offloaded.
struct ModelStates {
    param_device: f64,
    gathered_params: f64,
    grad_device: f64,
    grad_unit: f64,
    /// f32 sums of 16-bit gradients over a step's micro-batches (module header).
    grad_sums: f64,
    master_device: f64,
    opt_device: f64,
    host_per_rank: f64,
    nvme_per_rank: f64,
}

impl ModelStates {
    fn of(problem: &Problem, s: &Strategy) -> ModelStates {
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

/// Communication buffers: DDP buckets; DeepSpeed reduce + all-gather buckets at stages 1–2,
/// reduce bucket at stage 3 (gathered parameters are counted as parameters).
fn communication_bytes(problem: &Problem, s: &Strategy) -> f64 {
    let n = problem.hardware.world_size();
    let p = problem.facts.params as f64;
    let (pb, gb) = (
        s.precision.param_bytes() as f64,
        s.precision.grad_bytes() as f64,
    );
    let opt_off = s.placement.offload_optimizer != Offload::None;
    let bucket = (problem.cost.bucket_elements as f64).min(p);
    match s.placement.zero_stage.number() {
        0 if n > 1 => 2.0 * DDP_BUCKET_BYTES,
        1 | 2 if n > 1 || opt_off => bucket * (gb + pb),
        3 if n > 1 || opt_off => bucket * gb,
        _ => 0.0,
    }
}

/// The loss's transient workspace at the start of backward: its vocabulary-sized gradients
/// (`activation::logits_grad`; none when the loss writes its gradient into its saved softmax,
/// `LossImpl::InPlace`).
fn loss_backward_bytes(problem: &Problem, s: &Strategy) -> f64 {
    let (seq, b) = (problem.workload.seq_len as f64, s.micro_batch as f64);
    let e = activation::Width::of(problem.framework, s).e;
    match problem.loss_impl {
        LossImpl::HuggingFace | LossImpl::Separate | LossImpl::Sum => {
            activation::logits_grad(&problem.spec, seq, b, e, s.loss)
        }
        LossImpl::InPlace => 0.0,
    }
}

/// A block's transient workspace in backward: the naive attention's score gradients
/// (2·e·as²b), none for memory-efficient attention.
fn block_backward_bytes(problem: &Problem, s: &Strategy) -> f64 {
    let spec = &problem.spec;
    let (seq, b) = (problem.workload.seq_len as f64, s.micro_batch as f64);
    let e = s.precision.activation_bytes() as f64;
    match s.attention {
        Attention::Naive => 2.0 * e * spec.num_heads as f64 * seq * seq * b,
        Attention::MemoryEfficient => 0.0,
    }
}

/// Parameter gradients alive when the loss's backward runs, the first node of backward: under
/// PyTorch (DDP, FSDP) `zero_grad()` sets every `.grad` to `None` (its default since PyTorch
/// 2.0, and `Trainer`'s), so with one micro-batch per step none exists yet (FSDP's unsharded
/// unit gradient neither); with accumulation the earlier micro-batches' gradients are held.
/// DeepSpeed's engines keep their gradient partitions and buckets between steps: all of them.
fn gradients_at_loss_backward(problem: &Problem, s: &Strategy, states: &ModelStates) -> f64 {
    let all = states.grad_device + states.grad_unit + states.grad_sums;
    match problem.framework == Framework::Fsdp && s.accumulation == 1 {
        true => 0.0,
        false => all,
    }
}

/// Optimizer-step temporaries on the device.
fn optimizer_step_bytes(problem: &Problem, s: &Strategy) -> f64 {
    if s.placement.offload_optimizer != Offload::None {
        return 0.0;
    }
    let n = problem.hardware.world_size() as f64;
    let p = problem.facts.params as f64;
    let local_params = p / if s.placement.zero_stage.shards_optimizer() {
        n
    } else {
        1.0
    };
    // With the step in backward each parameter is stepped alone, as a per-tensor loop and a
    // fused kernel step theirs (a fused kernel's intermediates stay in registers).
    let local_params = match (s.optimizer_in_backward, problem.optimizer_impl) {
        (_, OptimizerImpl::Fused) => 0.0,
        (true, _) | (false, OptimizerImpl::PerTensor) => problem.facts.largest_layer_params as f64,
        (false, OptimizerImpl::Foreach) => local_params,
    };
    // PyTorch's foreach AdamW (`_multi_tensor_adam` in `torch/optim/adam.py`, which AdamW
    // runs with decoupled weight decay) updates in place — `_foreach_mul_` of the parameters
    // by 1 − lr·wd, `_foreach_lerp_` of the momentum, `_foreach_mul_`/`_foreach_addcmul_` of
    // the variance, `_foreach_div_`/`_foreach_add_` of the denominator, `_foreach_addcdiv_`
    // of the parameters — except `exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)`, one new list
    // of the variance's size and dtype for every tensor of the group at once (the gradients
    // stay alive beside it). So one copy of the local parameters in the states' format: fp32
    // under fp32 and mixed precision, bf16 under pure bf16 and for bf16 states.
    let sd = s.optimizer.state_format(s.precision).bytes() as f64;
    match s.optimizer {
        Optimizer::AdamW | Optimizer::AdamWBf16 | Optimizer::Lamb | Optimizer::SgdMomentum => {
            local_params * sd
        }
        // HF Adafactor works tensor by tensor: an fp32 update and squared gradient.
        Optimizer::Adafactor => 2.0 * 4.0 * problem.facts.largest_layer_params as f64,
        Optimizer::AdamW8bit | Optimizer::PagedAdamW8bit | Optimizer::Sgd => 0.0,
    }
}

/// What activation offload moves: the checkpointed inputs go to the host, and the device keeps
/// the one fetched back for the block backward recomputes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OffloadedActivations {
    /// Bytes on the host per rank (all checkpointed inputs of one micro-batch).
    pub host: f64,
    /// Bytes the device no longer holds at the peak (all inputs but the fetched one).
    pub device_saving: f64,
}

/// The checkpointed inputs `s` moves to the host (none unless it offloads activations).
pub fn offloaded_activation_bytes(problem: &Problem, s: &Strategy) -> OffloadedActivations {
    if !s.placement.offload_activations.is_offloaded() {
        return OffloadedActivations {
            host: 0.0,
            device_saving: 0.0,
        };
    }
    let w = activation::Width::of(problem.framework, s);
    let (seq, b) = (problem.workload.seq_len as f64, s.micro_batch as f64);
    let (count, input) = activation::checkpointed_inputs(
        &problem.spec,
        seq,
        b,
        w,
        s.attention,
        s.checkpoint,
        s.loss,
    );
    OffloadedActivations {
        host: count as f64 * input,
        device_saving: count.saturating_sub(1) as f64 * input,
    }
}

/// Predicts the memory of `s` on `problem`.
pub fn predict(problem: &Problem, s: &Strategy) -> MemoryPrediction {
    let spec = &problem.spec;
    let hw = &problem.hardware;
    let states = ModelStates::of(problem, s);
    let w = activation::Width::of(problem.framework, s);
    let (seq, b) = (problem.workload.seq_len as f64, s.micro_batch as f64);
    let comm = communication_bytes(problem, s);
    let offloaded = offloaded_activation_bytes(problem, s);
    let activations =
        (activation::model_activations(spec, seq, b, w, s.attention, s.checkpoint, s.loss)
            - offloaded.device_saving)
            * problem.cost.activation_scale;
    // At the loss's node no block has been re-run, and every offloaded input is on the host.
    let activations_at_loss =
        (activation::held_at_backward_start(spec, seq, b, w, s.attention, s.checkpoint, s.loss)
            - offloaded.host)
            * problem.cost.activation_scale;
    // input_ids, attention_mask and labels as int64.
    let input = 3.0 * 8.0 * seq * b;

    let frag = problem.cost.fragmentation;
    let ctx = hw.cuda_context_bytes as f64;
    let with_other = |parts: &[(Category, f64)]| -> CategoryBytes {
        let mut c: CategoryBytes = parts
            .iter()
            .map(|(c, v)| (*c, v.max(0.0).round() as u64))
            .collect();
        let allocated = c.total() as f64;
        c[Category::Other] = (ctx + frag * allocated).round() as u64;
        c
    };
    let parameters = states.param_device + states.gathered_params;
    let gradients = states.grad_device + states.grad_unit + states.grad_sums;
    let input = (Category::Input, input);
    let communication = (Category::Communication, comm);
    // Backward has two candidate peaks. Its first node, the loss's, holds every activation
    // kept from forward (no checkpointed block re-run yet) and allocates the vocabulary-sized
    // gradients before any parameter gradient exists (`gradients_at_loss_backward`); the
    // blocks' backward then holds the gradients as they are made and one re-run block, against
    // activations the loss no longer holds (the log-probabilities are released once the loss's
    // node has run), and a block's own workspace. A `logits.sum()` loop keeps the model's
    // output, whose logits stay through the blocks' backward too (`activation::logits`).
    let loss_held = match spec.sum_loss {
        true => 0.0,
        false => activation::logits(spec, seq, b, w.e, s.loss) * problem.cost.activation_scale,
    };
    let fb_loss = with_other(&[
        (Category::Parameter, parameters),
        (
            Category::Gradient,
            gradients_at_loss_backward(problem, s, &states),
        ),
        (Category::MasterWeight, states.master_device),
        (Category::OptimizerState, states.opt_device),
        (Category::Activation, activations_at_loss),
        (Category::Temporary, loss_backward_bytes(problem, s)),
        input,
        communication,
    ]);
    // With no gradient before backward, the blocks make theirs as they release their saved
    // activations (`backward`); otherwise every gradient is there throughout.
    let fresh = gradients_at_loss_backward(problem, s, &states) == 0.0
        && !s.placement.offload_activations.is_offloaded();
    let (blocks_activations, gradients) = match fresh {
        true => {
            let held = (activation::held_at_backward_start(
                spec,
                seq,
                b,
                w,
                s.attention,
                s.checkpoint,
                s.loss,
            ) - activation::outside_blocks(spec, seq, b, w, s.loss))
                * problem.cost.activation_scale;
            let made = states.grad_device * backward::block_share(&problem.facts);
            let (a, g) = backward::fullest(spec.total_blocks(), held, made);
            (activations - loss_held - held + a, gradients - made + g)
        }
        false => (activations - loss_held, gradients),
    };
    let fb_blocks = with_other(&[
        (Category::Parameter, parameters),
        (Category::Gradient, gradients),
        (Category::MasterWeight, states.master_device),
        (Category::OptimizerState, states.opt_device),
        (Category::Activation, blocks_activations),
        (Category::Temporary, block_backward_bytes(problem, s)),
        input,
        communication,
    ]);
    let fb = match fb_loss.total() >= fb_blocks.total() {
        true => fb_loss,
        false => fb_blocks,
    };
    let step = with_other(&[
        (Category::Parameter, states.param_device),
        (Category::Gradient, states.grad_device + states.grad_sums),
        (Category::MasterWeight, states.master_device),
        (Category::OptimizerState, states.opt_device),
        (Category::Temporary, optimizer_step_bytes(problem, s)),
        (Category::Communication, comm),
    ]);
    let steady = with_other(&[
        (Category::Parameter, states.param_device),
        (Category::MasterWeight, states.master_device),
        (Category::OptimizerState, states.opt_device),
        (Category::Communication, comm),
    ]);
    let (by_category, peak_phase) = if step.total() > fb.total() {
        (step, Phase::OptimizerStep)
    } else {
        (fb, Phase::ForwardBackward)
    };
    MemoryPrediction {
        per_device_peak_bytes: by_category.total(),
        breakdown: MemoryBreakdown {
            at_peak: by_category,
            steady,
        },
        peak_phase,
        capacity_bytes: hw.gpu.memory_bytes,
        usable_bytes: problem.usable_device_bytes(),
        host_bytes_per_node: ((states.host_per_rank
            + offloaded.host * problem.cost.activation_scale
            + loader_host_bytes(problem, s))
            * hw.gpus_per_node as f64)
            .round() as u64,
        nvme_bytes_per_node: (states.nvme_per_rank * hw.gpus_per_node as f64).round() as u64,
    }
}
