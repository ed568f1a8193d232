//! `Gradients`: where backward leaves the gradients of tracked leaves, keyed by variable id.
//! A leaf can be bound to a preallocated buffer (a parameter's view into its block's flat
//! `gradient` buffer); contributions are then added in place, across backward calls too
//! (gradient accumulation). Unbound leaves get a fresh contiguous tensor tagged `gradient`.
//!
//! Not for: gradients of activations (they live on the tape walk only, tagged `temporary`).

use crate::error::{Result, TensorError};
use crate::ops::copy_into;
use crate::tape::VarId;
use crate::tensor::Tensor;
use headroom_memory::Category;
use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct Gradients {
    map: HashMap<VarId, Tensor>,
}

impl Gradients {
    pub fn new() -> Gradients {
        Gradients::default()
    }

    /// Binds `leaf`'s gradient to `buffer` (same shape and dtype), which backward adds into.
    pub fn bind(&mut self, leaf: &Tensor, buffer: Tensor) -> Result<()> {
        let var = leaf.var().ok_or_else(|| {
            TensorError::invalid(
                "Gradients::bind",
                "the tensor is not tracked (call track())",
            )
        })?;
        if leaf.shape() != buffer.shape() || leaf.dtype() != buffer.dtype() {
            return Err(TensorError::ShapeMismatch {
                op: "Gradients::bind",
                lhs: leaf.shape().to_vec(),
                rhs: buffer.shape().to_vec(),
            });
        }
        self.map.insert(var, buffer);
        Ok(())
    }

    /// The gradient of a tracked leaf, if backward reached it.
    pub fn get(&self, leaf: &Tensor) -> Option<&Tensor> {
        self.map.get(&leaf.var()?)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub(crate) fn accumulate(&mut self, var: VarId, g: &Tensor) -> Result<()> {
        match self.map.get(&var) {
            Some(buffer) => buffer.add_assign(g),
            None => {
                let owned = Tensor::empty_in(
                    &g.device(),
                    g.shape(),
                    g.dtype(),
                    Category::Gradient,
                    Some("grad"),
                )?;
                copy_into(g, &owned)?;
                self.map.insert(var, owned);
                Ok(())
            }
        }
    }
}
