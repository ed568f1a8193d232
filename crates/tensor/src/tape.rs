//! The tape: an arena of recorded ops in execution order (a topological order), each with the
//! variable ids of its inputs and output and exactly the tensors its backward rule needs.
//! Backward pops nodes in reverse, so each node's saved tensors are freed right after its rule
//! ran (their last use); gradients of activations live only until their producer is processed.
//!
//! Not for: the derivative rules themselves (see `backprop`).

use crate::adjoint::Adjoints;
use crate::backprop::{self, Op};
use crate::context;
use crate::error::{Result, TensorError};
use crate::grads::Gradients;
use crate::tensor::Tensor;
use headroom_memory::Category;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The identity of an autodiff variable (a tracked leaf or a recorded op's output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(u64);

impl VarId {
    pub(crate) fn fresh() -> VarId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        VarId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

pub(crate) struct Node {
    pub op: Op,
    pub inputs: Vec<Option<VarId>>,
    pub output: VarId,
}

#[derive(Default)]
pub(crate) struct TapeInner {
    nodes: Vec<Node>,
}

/// Records ops run inside [`Tape::record`] and runs them backward.
#[derive(Clone, Default)]
pub struct Tape {
    inner: Rc<RefCell<TapeInner>>,
}

impl fmt::Debug for Tape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tape").field("nodes", &self.len()).finish()
    }
}

/// Records `op` producing `out` from `inputs` on the current tape, if any input is tracked
/// and a tape is recording; returns `out` tagged with its new variable id.
pub(crate) fn record(out: Tensor, inputs: &[&Tensor], op: impl FnOnce() -> Op) -> Tensor {
    if !inputs.iter().any(|t| t.requires_grad()) {
        return out;
    }
    record_always(out, inputs, op)
}

/// Records `op` on the current tape whether or not an input is tracked (checkpoint scopes).
pub(crate) fn record_always(out: Tensor, inputs: &[&Tensor], op: impl FnOnce() -> Op) -> Tensor {
    let Some(tape) = context::recording_tape() else {
        return out.detach();
    };
    let output = VarId::fresh();
    let node = Node {
        op: op(),
        inputs: inputs.iter().map(|t| t.var()).collect(),
        output,
    };
    tape.borrow_mut().nodes.push(node);
    out.with_var(output)
}

/// Whether an op on `inputs` will be recorded (so it should keep what its backward needs).
pub(crate) fn will_record(inputs: &[&Tensor]) -> bool {
    inputs.iter().any(|t| t.requires_grad()) && context::recording_tape().is_some()
}

impl Tape {
    pub fn new() -> Tape {
        Tape::default()
    }

    /// Runs `f` with this tape recording every op on tracked tensors.
    pub fn record<R>(&self, f: impl FnOnce() -> R) -> R {
        context::with_tape(self.inner.clone(), f)
    }

    /// Number of recorded ops not yet consumed by backward.
    pub fn len(&self) -> usize {
        self.inner.borrow().nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every recorded op (and with them the saved activations) without running backward.
    pub fn clear(&self) {
        let nodes = std::mem::take(&mut self.inner.borrow_mut().nodes);
        drop(nodes);
    }

    /// Backward from a one-element `loss` (seed 1): consumes the tape, accumulates each tracked
    /// leaf's gradient into `grads` (into bound buffers where present, else new `gradient`
    /// tensors), and frees every saved tensor after its last use.
    pub fn backward(&self, loss: &Tensor, grads: &mut Gradients) -> Result<()> {
        let var = loss
            .var()
            .ok_or_else(|| TensorError::Backward("the loss was not recorded on a tape (was it computed inside Tape::record with tracked inputs?)".into()))?;
        if loss.numel() != 1 {
            return Err(TensorError::Backward(format!(
                "the loss must have one element, got shape {:?}",
                loss.shape()
            )));
        }
        let seed = Tensor::full(
            &loss.device(),
            loss.shape(),
            1.0,
            loss.dtype(),
            Category::Temporary,
            Some("grad.seed"),
        )?;
        self.backward_from(vec![(var, seed)], grads, &HashSet::new())
            .map(|_| ())
    }

    /// The backward walk. Gradients of `capture`d variables are returned instead of being
    /// accumulated into `grads` (a checkpoint's recompute returns its inputs' gradients).
    pub(crate) fn backward_from(
        &self,
        seeds: Vec<(VarId, Tensor)>,
        grads: &mut Gradients,
        capture: &HashSet<VarId>,
    ) -> Result<HashMap<VarId, Tensor>> {
        let mut nodes = std::mem::take(&mut self.inner.borrow_mut().nodes);
        let produced: HashSet<VarId> = nodes.iter().map(|n| n.output).collect();
        let mut adjoint = Adjoints::default();
        let mut captured = HashMap::new();
        for (v, g) in seeds {
            route(v, g, &produced, capture, &mut adjoint, &mut captured, grads)?;
        }
        // Backward's dtypes follow the forward's: autocast is off while the rules run.
        crate::autocast::with_state(None, || {
            context::with_output_category(Category::Temporary, || {
                context::no_grad(|| -> Result<()> {
                    while let Some(node) = nodes.pop() {
                        let Some(dy) = adjoint.take(node.output)? else {
                            continue; // does not reach the loss; its saved tensors drop here
                        };
                        // A view's gradient waits, unpadded, beside its siblings' (`adjoint`).
                        if let (
                            Op::Narrow {
                                in_shape,
                                axis,
                                start,
                            },
                            [Some(var)],
                        ) = (&node.op, node.inputs.as_slice())
                            && produced.contains(var)
                            && !capture.contains(var)
                        {
                            adjoint.add_slice(*var, dy, in_shape, *axis, *start)?;
                            continue;
                        }
                        let needs: Vec<bool> = node.inputs.iter().map(Option::is_some).collect();
                        let dxs = backprop::backward(node.op, &dy, &needs, grads)?;
                        drop(dy);
                        for (var, g) in node.inputs.into_iter().zip(dxs) {
                            let (Some(var), Some(g)) = (var, g) else {
                                continue;
                            };
                            route(
                                var,
                                g,
                                &produced,
                                capture,
                                &mut adjoint,
                                &mut captured,
                                grads,
                            )?;
                        }
                    }
                    Ok(())
                })
            })
        })?;
        Ok(captured)
    }
}

/// Sends a gradient to where it belongs: returned to the caller (captured), kept for the op
/// that produced the variable (adjoint), or accumulated as a leaf's gradient.
fn route(
    var: VarId,
    g: Tensor,
    produced: &HashSet<VarId>,
    capture: &HashSet<VarId>,
    adjoint: &mut Adjoints,
    captured: &mut HashMap<VarId, Tensor>,
    grads: &mut Gradients,
) -> Result<()> {
    if capture.contains(&var) {
        accumulate(captured, var, g)
    } else if produced.contains(&var) {
        adjoint.add(var, g)
    } else {
        grads.accumulate(var, &g)
    }
}

/// Sums gradient contributions out of place (an adjoint may be a view shared with another).
fn accumulate(map: &mut HashMap<VarId, Tensor>, var: VarId, g: Tensor) -> Result<()> {
    let sum = match map.remove(&var) {
        Some(prev) => prev.add(&g)?,
        None => g,
    };
    map.insert(var, sum);
    Ok(())
}
