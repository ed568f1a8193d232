//! What activation offload moves: the checkpointed inputs (`activation::checkpointed_inputs`)
//! go to the host, all but the one backward fetches back.
//!
//! Not for: offloaded model states (see `states`).

use crate::cost::{Problem, activation};
use crate::strategy::Strategy;

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
