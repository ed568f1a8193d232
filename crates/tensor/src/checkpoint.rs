//! Checkpoint scopes: `checkpoint(inputs, f)` runs `f` without recording its internals, so
//! none of its intermediate tensors is kept; the tape holds one node with the inputs, the RNG
//! cursor and `f` itself. In backward that node re-runs `f` on a sub-tape (same inputs, same
//! dropout masks), back-propagates through the sub-tape, and hands the inputs' gradients on.
//! Parameters captured by `f` get their gradients through the same `Gradients`.
//!
//! Policies (every block, every k-th block, √n segments, selective) are decisions of the caller
//! about where to put scopes; this module is the mechanism they share.
//!
//! Not for: choosing what to checkpoint.

use crate::autocast;
use crate::backprop::Op;
use crate::context;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::grads::Gradients;
use crate::rng::{self, RngState};
use crate::stash::{self, Stashed};
use crate::tape::{Tape, VarId, record_always};
use crate::tensor::Tensor;
use headroom_memory::Category;
use std::collections::HashSet;
use std::rc::Rc;

/// The function a checkpoint scope runs (and re-runs in backward).
pub type ScopeFn = Rc<dyn Fn(&[Tensor]) -> Result<Tensor>>;

/// An input a checkpoint node keeps: on the device, or in host memory (activation offload).
pub(crate) enum Saved {
    Device(Tensor),
    Host(Stashed),
}

/// What a checkpoint node keeps: the inputs, the function and the RNG cursor at entry.
pub(crate) struct CheckpointOp {
    inputs: Vec<Saved>,
    f: ScopeFn,
    rng: RngState,
    /// The autocast state the scope ran under; the recompute uses it again.
    autocast: Option<DType>,
}

/// Runs `f(inputs)`; when a tape is recording, keeps only `inputs` and recomputes `f` in
/// backward. Outside a recording tape it is a plain call.
pub fn checkpoint(
    inputs: &[&Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor> + 'static,
) -> Result<Tensor> {
    scope(inputs, false, f)
}

/// [`checkpoint`] for a block (or a segment of blocks) of a model: inside
/// [`crate::with_activation_offload`] the inputs it keeps go to host memory until backward
/// recomputes it (`stash`).
pub fn checkpoint_block(
    inputs: &[&Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor> + 'static,
) -> Result<Tensor> {
    scope(inputs, true, f)
}

fn scope(
    inputs: &[&Tensor],
    offloadable: bool,
    f: impl Fn(&[Tensor]) -> Result<Tensor> + 'static,
) -> Result<Tensor> {
    let inputs: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
    if context::recording_tape().is_none() {
        return f(&inputs);
    }
    let rng = rng::get_state();
    let autocast = autocast::autocast_dtype();
    let out = context::no_grad(|| f(&inputs))?;
    // Recorded even when no input is tracked: `f` may capture parameters.
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let f: ScopeFn = Rc::new(f);
    let pool = stash::active().filter(|_| offloadable);
    let saved = inputs
        .iter()
        .map(|t| {
            Ok(match &pool {
                Some(pool) => {
                    stash::stash(pool, t)?.map_or_else(|| Saved::Device(t.clone()), Saved::Host)
                }
                None => Saved::Device(t.clone()),
            })
        })
        .collect::<Result<Vec<Saved>>>()?;
    Ok(record_always(out.detach(), &refs, move || {
        Op::Checkpoint(CheckpointOp {
            inputs: saved,
            f,
            rng,
            autocast,
        })
    }))
}

/// The checkpoint node's rule: recompute on a sub-tape, back-propagate, return input gradients.
pub(crate) fn backward(
    op: CheckpointOp,
    dy: &Tensor,
    grads: &mut Gradients,
) -> Result<Vec<Option<Tensor>>> {
    let CheckpointOp {
        inputs,
        f,
        rng,
        autocast: cast_state,
    } = op;
    let leaves: Vec<Tensor> = inputs
        .into_iter()
        .map(|saved| {
            let (t, tracked) = match saved {
                Saved::Device(t) => {
                    let tracked = t.requires_grad();
                    (t, tracked)
                }
                Saved::Host(s) => {
                    let tracked = s.requires_grad();
                    (s.fetch()?, tracked)
                }
            };
            Ok(if tracked {
                t.detach().track()
            } else {
                t.detach()
            })
        })
        .collect::<Result<Vec<Tensor>>>()?;
    let sub = Tape::new();
    let resume = rng::get_state();
    rng::set_state(rng);
    let out = context::with_output_category(Category::Activation, || {
        context::enable_grad(|| {
            autocast::with_state(cast_state, || {
                crate::backend::work::recomputing(|| sub.record(|| f(&leaves)))
            })
        })
    });
    rng::set_state(resume);
    let out = out?;
    let Some(out_var) = out.var() else {
        // Nothing inside the scope needed a gradient.
        return Ok(vec![None; leaves.len()]);
    };
    if out.shape() != dy.shape() {
        return Err(TensorError::Backward(format!(
            "checkpoint recompute gave shape {:?}, expected {:?}",
            out.shape(),
            dy.shape()
        )));
    }
    drop(out);
    let capture: HashSet<VarId> = leaves.iter().filter_map(Tensor::var).collect();
    let mut captured = sub.backward_from(vec![(out_var, dy.clone())], grads, &capture)?;
    Ok(leaves
        .iter()
        .map(|l| l.var().and_then(|v| captured.remove(&v)))
        .collect())
}
