//! An embedding table: rows of a (vocabulary × width) parameter picked by integer ids. Its one
//! slot is named as the module; a tied output head reads the same table transposed.
//!
//! Not for: the output projection (`lm_head.rs`).

use super::{Slot, Weights};
use headroom_tensor::{Result, Tensor};

/// A bound embedding table.
#[derive(Clone, Debug)]
pub struct Embedding {
    pub table: Tensor,
}

impl Embedding {
    /// The slot of a table named `name` of `rows` × `width`.
    pub fn slots(name: &str, rows: usize, width: usize) -> Vec<Slot> {
        vec![Slot::new(name, &[rows, width])]
    }

    pub fn load(w: &Weights, name: &str) -> Result<Embedding> {
        Ok(Embedding {
            table: w.get(name)?,
        })
    }

    /// `ids.shape + (width,)`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.table.embedding(ids)
    }
}
