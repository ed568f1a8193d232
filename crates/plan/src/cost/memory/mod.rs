//! Device, host and NVMe bytes of one strategy, per `Category`, at the step's peak.
//!
//! A step has two candidate peaks, and the larger one is reported:
//! - forward/backward: model states + activations (held at the start of backward) + transient
//!   workspace (logits gradient, naive-attention backward scores) + inputs + buffers;
//! - optimizer step: model states + the optimizer's temporaries (PyTorch `foreach` AdamW holds
//!   one copy of the parameters being updated in the states' format, the `_foreach_sqrt` of the
//!   variance; torchtune PR #389; docs/sources.md §10), no activations.
//!
//! `Other` holds the CUDA context (hardware field) plus the fragmentation reserve, a fraction of
//! everything else allocated.
//!
//! Model states are in `states`, the buffers and temporaries beside them in `buffers`, what
//! activation offload moves in `offload`.
//!
//! Not for: step time (see `time`).

mod buffers;
mod offload;
mod states;

use super::{Problem, activation, backward};
use crate::strategy::{Framework, Strategy, ZeroGrad};
use buffers::{
    block_backward_bytes, communication_bytes, loss_backward_bytes, optimizer_step_bytes,
};
use headroom_memory::{Category, CategoryBytes, MemoryBreakdown};
use serde::Serialize;
use states::ModelStates;

pub use offload::{OffloadedActivations, offloaded_activation_bytes};
pub use states::{model_state_bytes, optimizer_state_bytes};

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

/// Host bytes of one rank's data loader (staging buffers and workers), when the workload
/// gives one.
fn loader_host_bytes(problem: &Problem, s: &Strategy) -> f64 {
    let w = &problem.workload;
    w.loader
        .map_or(0.0, |l| l.host_bytes(s.micro_batch, w.seq_len) as f64)
}

/// Parameter gradients alive when the loss's backward runs, the first node of backward: under
/// PyTorch (DDP, FSDP) `zero_grad()` sets every `.grad` to `None` (its default since PyTorch
/// 2.0, and `Trainer`'s), so with one micro-batch per step none exists yet (FSDP's unsharded
/// unit gradient neither); with accumulation the earlier micro-batches' gradients are held,
/// and a loop whose `zero_grad()` zero-fills them in place (`ZeroGrad::ZeroFill`, PyTorch
/// before 2.0) holds every one from the previous step. DeepSpeed's engines keep their gradient
/// partitions and buckets between steps: all of them.
fn gradients_at_loss_backward(problem: &Problem, s: &Strategy, states: &ModelStates) -> f64 {
    let all = states.grad_device + states.grad_unit + states.grad_sums;
    let freed = problem.framework == Framework::Fsdp
        && s.accumulation == 1
        && problem.zero_grad == ZeroGrad::SetToNone;
    match freed {
        true => 0.0,
        false => all,
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
    // node has run), and a block's own workspace. A loop that keeps the model's output (a
    // `logits.sum()` benchmark, `outputs = model(...)`) keeps its logits through the blocks'
    // backward too (`activation::kept_logits`).
    let loss_held = (activation::logits(spec, seq, b, w.e, s.loss)
        - activation::kept_logits(spec, seq, b, w.e))
        * problem.cost.activation_scale;
    let gradients_at_loss = gradients_at_loss_backward(problem, s, &states);
    // What the loss's node holds, beside `temporary` (its own, or the moment before it).
    let at_loss_node = |temporary: f64| {
        with_other(&[
            (Category::Parameter, parameters),
            (Category::Gradient, gradients_at_loss),
            (Category::MasterWeight, states.master_device),
            (Category::OptimizerState, states.opt_device),
            (Category::Activation, activations_at_loss),
            (Category::Temporary, temporary),
            input,
            communication,
        ])
    };
    let fb_loss = at_loss_node(loss_backward_bytes(problem, s));
    // With no gradient before backward, the blocks make theirs as they release their saved
    // activations (`backward`); otherwise every gradient is there throughout.
    let fresh = gradients_at_loss == 0.0 && !s.placement.offload_activations.is_offloaded();
    let (blocks_activations, gradients) = match fresh {
        true => {
            // What the blocks hold when backward starts: the loss's node's activations (no
            // activation is offloaded here) less those outside the blocks.
            let held = activations_at_loss
                - activation::outside_blocks(spec, seq, b, w, s.loss)
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
    // A loop that keeps the model's output ends its next forward, at the output projection and
    // the loss, with the previous step's output still held beside the new logits
    // (`activation::previous_outputs`): what the loss's node holds, with the previous output
    // and the loss's fp32 copy of the logits in place of the logits' gradients. Like those
    // gradients, unscaled by the calibration: a `logits.sum()` loop without a cache ties with
    // the loss's node, as it should.
    let policy = activation::effective_policy(spec, seq, b, w, s.attention, s.checkpoint, s.loss);
    let previous = activation::previous_outputs(spec, seq, b, w.e, policy);
    let forward_end = match previous > 0.0 {
        true => at_loss_node(previous + activation::upcast_logits(spec, seq, b, w.e)),
        false => fb_loss,
    };
    let fb = [fb_loss, fb_blocks, forward_end]
        .into_iter()
        .reduce(|a, c| match a.total() >= c.total() {
            true => a,
            false => c,
        })
        .expect("three candidates");
    // At the optimizer step a loop that keeps the model's output still holds this step's, the
    // size of the previous one's.
    let step = with_other(&[
        (Category::Parameter, states.param_device),
        (Category::Gradient, states.grad_device + states.grad_sums),
        (Category::MasterWeight, states.master_device),
        (Category::OptimizerState, states.opt_device),
        (Category::Activation, previous),
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
