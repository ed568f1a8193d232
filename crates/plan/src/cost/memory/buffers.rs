//! Device bytes beside model states and activations: communication buckets and the temporaries
//! of the loss's backward, of a block's backward and of the optimizer step.
//!
//! Not for: model states (see `states`).

use crate::cost::{Problem, activation};
use crate::strategy::{Attention, LossImpl, Offload, Optimizer, OptimizerImpl, Strategy};

/// PyTorch DDP's default `bucket_cap_mb` (25 MiB); two buckets in flight.
const DDP_BUCKET_BYTES: f64 = 25.0 * 1024.0 * 1024.0;

/// Communication buffers: DDP buckets; DeepSpeed reduce + all-gather buckets at stages 1–2,
/// reduce bucket at stage 3 (gathered parameters are counted as parameters).
pub(super) fn communication_bytes(problem: &Problem, s: &Strategy) -> f64 {
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
pub(super) fn loss_backward_bytes(problem: &Problem, s: &Strategy) -> f64 {
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
/// (2·e·as²b), none for memory-efficient attention; under QLoRA the NF4 weight being
/// dequantised for a product (`LoraCounts::dequantized_bytes`). The two are never alive
/// together (the projections' products run before and after the attention core's backward,
/// each freeing its weight), so the larger counts. The base's loaded dtype input
/// (`Workload::lora_base_dtype`) describes the tensors left unquantised, which PEFT's
/// `prepare_model_for_kbit_training` recasts after quantisation, not the NF4 weights' source.
pub(super) fn block_backward_bytes(problem: &Problem, s: &Strategy) -> f64 {
    let spec = &problem.spec;
    let (seq, b) = (problem.workload.seq_len as f64, s.micro_batch as f64);
    let e = s.precision.activation_bytes();
    let scores = match s.attention {
        Attention::Naive => 2.0 * e as f64 * spec.num_heads as f64 * seq * seq * b,
        Attention::MemoryEfficient => 0.0,
    };
    let dequantized = problem.facts.lora.map_or(0, |l| l.dequantized_bytes(e));
    scores.max(dequantized as f64)
}

/// Optimizer-step temporaries on the device.
pub(super) fn optimizer_step_bytes(problem: &Problem, s: &Strategy) -> f64 {
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
