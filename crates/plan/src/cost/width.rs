//! Bytes per saved activation element, by what the element is: plain runs save everything at
//! the compute width; PyTorch's autocast keeps "fp32 islands" (softmax, norms) that the
//! activation terms of `activation` charge at 4 bytes (docs/sources.md §4).
//!
//! Not for: which tensors a block saves (see `activation`).

use crate::strategy::{Framework, Strategy};

/// Bytes per saved element, by what the element is. Plain runs save everything at the compute
/// width `e`; PyTorch's autocast computes softmax and norms in fp32 (its "fp32 islands",
/// docs/sources.md §4), so naive attention's saved probabilities are fp32, and under DDP, where
/// the weights stay fp32, the residual stream (the embedding's fp32 output plus 16-bit branch
/// outputs, promoted) is fp32 too: every norm input and every block input is 4 bytes, and each
/// projection reading a norm's fp32 output saves its own 16-bit cast of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Width {
    /// Compute width: projection inputs and outputs, MLP intermediates.
    pub e: f64,
    /// Naive attention's saved softmax output.
    pub softmax: f64,
    /// The residual stream: norm inputs and checkpointed block inputs.
    pub residual: f64,
}

impl From<f64> for Width {
    fn from(e: f64) -> Width {
        Width {
            e,
            softmax: e,
            residual: e,
        }
    }
}

impl Width {
    /// The widths `s` saves at under `framework`'s mixed precision: DeepSpeed runs a 16-bit
    /// model (no islands); PyTorch autocasts (fp32 softmax), with an fp32 residual stream where
    /// the weights are fp32 at compute time (DDP, ZeRO-1's `ZeroRedundancyOptimizer`; FSDP's
    /// `MixedPrecision` gathers 16-bit weights at stages 2–3).
    pub fn of(framework: Framework, s: &Strategy) -> Width {
        let e = s.precision.activation_bytes() as f64;
        if framework == Framework::DeepSpeed || !s.precision.master_weights() {
            return Width::from(e);
        }
        let fp32_weights = !s.placement.zero_stage.shards_gradients();
        Width {
            e,
            softmax: 4.0,
            residual: if fp32_weights { 4.0 } else { e },
        }
    }

    /// Whether a norm's output is wider than the projections reading it (each then saves its
    /// own cast).
    pub(super) fn casts_norm_outputs(&self) -> bool {
        self.residual > self.e
    }
}
