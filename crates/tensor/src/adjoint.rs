//! Gradients waiting for the op that produced their variable (the tape's adjoints). A tensor
//! split into views along one axis — q, k and v narrowed out of one projection's output — gets
//! one gradient per view; summing their zero-padded copies would cost, per view, a zero fill
//! of the whole input's size and an add. Instead the views' gradients are kept apart until the
//! producer's rule needs the whole gradient, and then each is copied into its slice of one
//! buffer (zero-filled only where no view covers it). The values are those of the padded sum;
//! only a −0 entry may stay −0 where the sum of paddings turned it into +0.
//!
//! Not for: the walk over the tape (see `tape`) or leaf gradients (see `grads`).

use crate::error::Result;
use crate::ops::copy_into;
use crate::tape::VarId;
use crate::tensor::Tensor;
use std::collections::HashMap;

/// One variable's pending gradient.
enum Pending {
    Dense(Tensor),
    /// Gradients of disjoint slices `start..start + len` along `axis` of a tensor of `shape`.
    Slices {
        shape: Vec<usize>,
        axis: usize,
        parts: Vec<(usize, Tensor)>,
    },
}

/// The pending gradients of one backward walk.
#[derive(Default)]
pub(crate) struct Adjoints {
    map: HashMap<VarId, Pending>,
}

impl Adjoints {
    /// Adds a gradient contribution for all of `var`.
    pub(crate) fn add(&mut self, var: VarId, g: Tensor) -> Result<()> {
        let sum = match self.map.remove(&var) {
            None => g,
            Some(prev) => prev.into_dense()?.add(&g)?,
        };
        self.map.insert(var, Pending::Dense(sum));
        Ok(())
    }

    /// Adds the gradient `g` of the slice of `var` (of `shape`) starting at `start` on `axis`.
    pub(crate) fn add_slice(
        &mut self,
        var: VarId,
        g: Tensor,
        shape: &[usize],
        axis: usize,
        start: usize,
    ) -> Result<()> {
        let len = g.shape()[axis];
        let pending = match self.map.remove(&var) {
            None => Pending::Slices {
                shape: shape.to_vec(),
                axis,
                parts: vec![(start, g)],
            },
            Some(Pending::Slices {
                shape: s,
                axis: a,
                mut parts,
            }) if s == shape
                && a == axis
                && parts
                    .iter()
                    .all(|(p, t)| start + len <= *p || p + t.shape()[axis] <= start) =>
            {
                parts.push((start, g));
                Pending::Slices {
                    shape: s,
                    axis: a,
                    parts,
                }
            }
            Some(prev) => Pending::Dense(prev.into_dense()?.add(&g.pad_into(shape, axis, start)?)?),
        };
        self.map.insert(var, pending);
        Ok(())
    }

    /// Removes and returns `var`'s whole gradient, if any contribution reached it.
    pub(crate) fn take(&mut self, var: VarId) -> Result<Option<Tensor>> {
        self.map.remove(&var).map(Pending::into_dense).transpose()
    }
}

impl Pending {
    fn into_dense(self) -> Result<Tensor> {
        let (shape, axis, mut parts) = match self {
            Pending::Dense(t) => return Ok(t),
            Pending::Slices { shape, axis, parts } => (shape, axis, parts),
        };
        parts.sort_by_key(|(start, _)| *start);
        let first = &parts[0].1;
        if parts.len() == 1 {
            return first.pad_into(&shape, axis, parts[0].0);
        }
        let out = Tensor::empty(&first.device(), &shape, first.dtype(), "grad.slices")?;
        let mut covered = 0;
        let mut gaps = false;
        for (start, t) in &parts {
            gaps |= *start != covered;
            covered = start + t.shape()[axis];
        }
        if gaps || covered != shape[axis] {
            out.fill_(0.0)?;
        }
        for (start, t) in &parts {
            let slice = out.with_layout(out.layout().narrow(axis, *start, t.shape()[axis])?);
            copy_into(t, &slice)?;
        }
        Ok(out)
    }
}
