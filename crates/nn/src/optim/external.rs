//! Updating state held outside the device (an offload tier): the device update's arithmetic on
//! bytes the caller holds, in [`Optimizer::state_layout`]'s order.
//!
//! Not for: state on the device (see the parent `optim`).

use super::apply::{apply, sums_of};
use super::{FlatParams, Optimizer, TensorShape, TensorSums, UpdateRule};

impl Optimizer {
    /// [`Optimizer::update_group_with`] on state held outside the device (an offload tier):
    /// `state` is the bytes of each state tensor in [`Optimizer::state_layout`]'s order. The
    /// arithmetic is the device update's, so the results are bitwise equal.
    pub fn update_external(
        &self,
        state: &mut [&mut [u8]],
        group: &mut FlatParams<'_>,
        grad_multiplier: f32,
        lr: f32,
        sums: Option<&[TensorSums]>,
    ) {
        // Offloaded states are AdamW's (the vocabulary refuses other optimizers with offload);
        // Adafactor's factored layout needs the buffer's index, which this update has not.
        assert!(
            self.config.kind != UpdateRule::Adafactor,
            "Adafactor's states are never offloaded"
        );
        let shapes = [TensorShape::Vector(group.params.len())];
        apply(
            &self.config,
            (self.step, &shapes),
            state,
            group,
            grad_multiplier,
            lr,
            sums,
        );
    }

    /// [`Optimizer::tensor_sums`] on state held outside the device.
    pub fn tensor_sums_external(
        &self,
        state: &[&[u8]],
        group: &FlatParams<'_>,
        grad_multiplier: f32,
        lr: f32,
    ) -> Vec<TensorSums> {
        if !self.needs_tensor_sums() {
            return Vec::new();
        }
        sums_of(&self.config, self.step, state, group, grad_multiplier, lr)
    }
}
