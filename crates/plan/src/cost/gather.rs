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

/// Elements a device holds unsharded under full sharding: (parameters gathered for compute,
/// gradient elements produced whole before their reduce-scatter). Zero below stage 3.
pub fn gathered_elements(problem: &Problem, s: &Strategy) -> (f64, f64) {
    if !s.placement.zero_stage.shards_parameters() {
        return (0.0, 0.0);
    }
    let f = &problem.facts;
    let n = problem.hardware.world_size() as f64;
    let p = f.params as f64;
    let par_off = s.placement.offload_params != Offload::None;
    let opt_off = s.placement.offload_optimizer != Offload::None;
    let remote = if par_off { p } else { p * (n - 1.0) / n };
    // With optimizer offload each gradient is still produced on the device before it is
    // copied out, whatever the number of GPUs.
    let grad_window = if opt_off { p } else { remote };
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
                (live + persistent).min(remote),
                (f.largest_layer_params as f64).min(grad_window),
            )
        }
        Framework::Fsdp => {
            let block = f.block_params as f64;
            (
                (f.root_params as f64 + 2.0 * block).min(remote),
                block.max(f.root_params as f64).min(grad_window),
            )
        }
    }
}
