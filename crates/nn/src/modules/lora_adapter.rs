//! A LoRA adapter on one projection (Hu et al. 2021): the trainable low-rank update
//! `(α/r)·(x·A)·B` added to the frozen projection's output, with `A` (in × r) and `B`
//! (r × out) views of the model's adapter block.
//!
//! Not for: building or initialising the adapter blocks, or merging them into the base weights
//! (`models::lora`).

use headroom_tensor::{Result, Tensor};

/// Views of one adapter's `A` and `B`, and its scale α/r.
#[derive(Clone, Debug)]
pub struct LoraAdapter {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f32,
}

impl LoraAdapter {
    /// `y + (α/r)·(x·A)·B`. The scale multiplies the rank-r intermediate, the smallest tensor
    /// of the update.
    pub fn add_update(&self, x: &Tensor, y: Tensor) -> Result<Tensor> {
        y.add(&x.matmul(&self.a)?.scale(self.scale)?.matmul(&self.b)?)
    }
}

/// `y` with `adapter`'s update when there is one.
pub(crate) fn adapted(adapter: Option<&LoraAdapter>, x: &Tensor, y: Tensor) -> Result<Tensor> {
    match adapter {
        Some(a) => a.add_update(x, y),
        None => Ok(y),
    }
}
