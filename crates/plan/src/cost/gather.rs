//! What ZeRO-3 / FSDP full sharding holds unsharded on a device at once, per framework.
//!
//! - **DeepSpeed** fetches parameters module by module as the forward and backward reach them
//!   and prefetches up to `stage3_prefetch_bucket_size` elements of the modules that come next;
//!   no more than `stage3_max_live_parameters` are resident at once, and tensors of at most
//!   `stage3_param_persistence_threshold` elements are never partitioned (DeepSpeed's ZeRO-3
//!   configuration docs, deepspeed.ai/docs/config-json "ZeRO optimizations for FP16 training";
//!   Hugging Face's `"auto"` values: prefetch 0.9·h², persistence 10·h, which the DeepSpeed export
//!   writes). Each module's gradient is produced whole before it is copied into the reduce
//!   bucket: the largest module's.
//! - **FSDP** gathers a whole wrapped unit (one transformer block under
//!   `TRANSFORMER_BASED_WRAP` / torchtitan's per-block `fully_shard`) in the compute dtype, the
//!   current one and the prefetched next (its rate limiter allows two in-flight all-gathers; Zhao
//!   et al. 2023, §3.3), and the root unit — embeddings, final norm, head — from the start of
//!   forward to the end of backward, since the root is not resharded between them. A unit's
//!   gradient is reduce-scattered whole: one block's.
//!
//! What is gathered never exceeds what the other ranks hold (all of it when parameters are
//! offloaded to the host).
//!
//! Not for: the sharded states themselves (see `memory`).

use super::Problem;
use crate::strategy::{Framework, Offload, Strategy};

/// DeepSpeed's default `stage3_max_live_parameters` (1e9), written into the export.
pub const DEEPSPEED_MAX_LIVE_PARAMETERS: u64 = 1_000_000_000;

/// Hugging Face's `"auto"` `stage3_prefetch_bucket_size`: 0.9·h².
pub fn deepspeed_prefetch_bucket(hidden: u64) -> u64 {
    (0.9 * (hidden * hidden) as f64) as u64
}

/// Hugging Face's `"auto"` `stage3_param_persistence_threshold`: 10·h.
pub fn deepspeed_persistence_threshold(hidden: u64) -> u64 {
    10 * hidden
}

/// Bytes of the weights full sharding gathers: every parameter at the compute width `pb`,
/// except a LoRA run's frozen base, whose units hold its NF4 codes as stored (QLoRA; their
/// quantisation state is whole on every rank and never gathered) beside its 16-bit tensors and
/// the adapters.
struct GatheredWidth {
    /// The whole model's bytes as gathered (what the other ranks can send at most, shards
    /// included).
    model: f64,
    /// Bytes per element of the transformer blocks (the frozen base's block weights and the
    /// blocks' adapters, over the base's block elements).
    block_element: f64,
    /// Bytes per element outside the blocks and of the small tensors (embeddings, head,
    /// norms): frozen under LoRA, never quantised.
    root_element: f64,
}

impl GatheredWidth {
    fn of(problem: &Problem, s: &Strategy, pb: f64) -> GatheredWidth {
        let f = &problem.facts;
        let Some(lora) = f.lora else {
            return GatheredWidth {
                model: f.params as f64 * pb,
                block_element: pb,
                root_element: pb,
            };
        };
        // The adapters (trainable) all sit in blocks; the root (embeddings, final norm, head)
        // is frozen and never quantised.
        let adapters = f.params as f64 * pb;
        let (_, base) = problem.lora_base_widths(s);
        let root = f.root_params as f64;
        let base_block_elements = (f.total_params - f.params - f.root_params).max(1) as f64;
        let nf4_codes = (lora.frozen_nf4_bytes - lora.frozen_nf4_state_bytes) as f64;
        let frozen_block = (lora.frozen_plain as f64 - root) * base as f64 + nf4_codes;
        GatheredWidth {
            model: lora.frozen_sharded_bytes(base) as f64 + adapters,
            block_element: (frozen_block + adapters) / base_block_elements,
            root_element: base as f64,
        }
    }
}

/// What a device holds unsharded under full sharding: (bytes of parameters gathered for
/// compute, gradient elements produced whole before their reduce-scatter). Zero below stage 3.
///
/// A LoRA run's frozen base is sharded and gathered unit by unit like any parameter (FSDP's
/// flat parameters and DeepSpeed's partitions hold it whether it trains or not), and under
/// parameter offload to the host each unit is still copied to the device and gathered there;
/// only the gradients are the adapters' alone.
pub fn gathered(problem: &Problem, s: &Strategy) -> (f64, f64) {
    if !s.placement.zero_stage.shards_parameters() {
        return (0.0, 0.0);
    }
    let f = &problem.facts;
    let n = problem.hardware.world_size() as f64;
    let p = f.params as f64;
    let pb = s.precision.param_bytes() as f64;
    let width = GatheredWidth::of(problem, s, pb);
    let par_off = s.placement.offload_params != Offload::None;
    let opt_off = s.placement.offload_optimizer != Offload::None;
    let others = if par_off { 1.0 } else { (n - 1.0) / n };
    let remote = width.model * others;
    // With optimizer offload each gradient is still produced on the device before it is
    // copied out, whatever the number of GPUs.
    let grad_window = if opt_off { p } else { p * others };
    match problem.framework {
        Framework::DeepSpeed => {
            let unit = f.gather_unit_params as f64;
            let prefetch = (deepspeed_prefetch_bucket(problem.spec.hidden_size) as f64).min(unit);
            // A module is gathered whole even when it alone exceeds the live cap.
            let largest = f.largest_layer_params as f64;
            let live = (largest + prefetch)
                .min(DEEPSPEED_MAX_LIVE_PARAMETERS as f64)
                .max(largest);
            let persistent = f.persistent_params as f64;
            (
                (live * width.block_element + persistent * width.root_element).min(remote),
                (f.largest_layer_params as f64).min(grad_window),
            )
        }
        Framework::Fsdp => {
            let block = f.block_params as f64;
            let root = f.root_params as f64 * width.root_element;
            // Under LoRA only a unit's adapters have gradients (the root unit none).
            let unit_grad = match f.lora {
                Some(_) => p / problem.spec.total_blocks().max(1) as f64,
                None => block.max(f.root_params as f64),
            };
            (
                (root + 2.0 * block * width.block_element).min(remote),
                unit_grad.min(grad_window),
            )
        }
    }
}
