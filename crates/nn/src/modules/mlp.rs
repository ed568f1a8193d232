//! The transformer's GELU MLP (GPT-2's): `W₂·gelu(W₁·x + b₁) + b₂`, slots `{name}.fc` (width →
//! hidden) and `{name}.proj` (hidden → width). The GELU output is recomputed in backward, not
//! saved (`Linear::forward_gelu`).
//!
//! Under tensor parallelism (Megatron-LM's MLP, Shoeybi et al. 2019, arXiv:1909.08053 §3) `fc`
//! is column-parallel and `proj` row-parallel: each rank holds `hidden / tp` of the hidden
//! features, and the GELU output of its slice is saved for `proj`'s weight gradient.
//!
//! Not for: the gated MLP of the Llama family (`swiglu.rs`).

use super::{Linear, Slot, join};
use headroom_tensor::{Result, Tensor, TensorParallel};

/// A bound GELU MLP.
#[derive(Clone, Debug)]
pub struct Mlp {
    pub fc: Linear,
    pub proj: Linear,
    /// This rank's group when the hidden features are split over ranks.
    pub parallel: Option<TensorParallel>,
}

impl Mlp {
    pub fn slots(name: &str, width: usize, hidden: usize, bias: bool) -> Vec<Slot> {
        let mut slots = Linear::slots(&join(name, "fc"), width, hidden, bias);
        slots.extend(Linear::slots(&join(name, "proj"), hidden, width, bias));
        slots
    }

    /// (…, width) → (…, width).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(tp) = &self.parallel {
            return self.forward_parallel(x, tp);
        }
        let pre = self.fc.forward(x)?; // (…, hidden)
        self.proj.forward_gelu(&pre)
    }

    /// This rank's hidden slice: `fc` in the group's chunks of its columns, `proj` over the
    /// matching rows.
    fn forward_parallel(&self, x: &Tensor, tp: &TensorParallel) -> Result<Tensor> {
        let local = self.proj.dense_rows()?;
        let per = tp.chunks_per_rank();
        let w = local / per;
        let chunks: Vec<_> = (0..per).map(|j| vec![(j * w, w)]).collect();
        let pre = self.fc.forward_column_parallel(x, tp, &chunks)?; // (…, hidden / tp)
        self.proj.forward_row_parallel(&pre.gelu()?, tp)
    }
}
