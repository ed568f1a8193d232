//! When a block's gradient is complete in backward, for the hooks that act on it then (the ZeRO
//! reduce-scatter, the optimizer step in backward): backward has left every parameter scope that
//! reads the block. Each scope recorded on a tape counts one pending use of its blocks; a
//! scope's backward ends when the next scope's begins (or the pass ends), and a block with no
//! pending use left is complete. A tied embedding read at both ends of the model is complete
//! only at the end of backward. A checkpointed segment's recompute inside backward records its
//! scopes again, and their uses are counted like the first ones.
//!
//! Not for: what happens to a complete block (the hooks themselves).

use super::TrainError;
use headroom_tensor::TensorError;
use std::cell::RefCell;

/// A hook's failure as the tensor error backward expects. An error that is not the engine's own
/// (a collective's, say) is kept in `kept` for the trainer to return instead.
pub(super) fn hook_error(e: TrainError, kept: &RefCell<Option<TrainError>>) -> TensorError {
    let message = e.to_string();
    match e {
        TrainError::Engine(t) => t,
        TrainError::OutOfMemory(oom) => TensorError::OutOfMemory(oom),
        other => {
            *kept.borrow_mut() = Some(other);
            TensorError::Backward(message)
        }
    }
}

/// Pending uses of every block over one forward and backward pass.
pub(super) struct BlockUses {
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    /// Recorded scopes per block whose backward has not ended.
    pending: Vec<u32>,
    /// The scope whose backward is running.
    active: Option<Vec<usize>>,
    in_backward: bool,
}

impl BlockUses {
    /// No uses yet of `n` blocks.
    pub(super) fn new(n: usize) -> BlockUses {
        BlockUses {
            state: RefCell::new(State {
                pending: vec![0; n],
                ..State::default()
            }),
        }
    }

    /// A scope over `blocks` finished its forward (`marked`: recorded on a tape, so its backward
    /// will run). Returns whether backward is running, i.e. this was a recompute.
    pub(super) fn forward_ended(&self, blocks: &[usize], marked: bool) -> bool {
        let mut s = self.state.borrow_mut();
        if marked {
            for &b in blocks {
                s.pending[b] += 1;
            }
        }
        s.in_backward
    }

    /// The backward of a scope over `blocks` begins, which ends the previous scope's; returns
    /// the blocks that are complete now.
    pub(super) fn backward_begins(&self, blocks: &[usize]) -> Vec<usize> {
        let previous = {
            let mut s = self.state.borrow_mut();
            s.in_backward = true;
            s.active.replace(blocks.to_vec())
        };
        previous.map_or_else(Vec::new, |p| self.end_scope(&p))
    }

    /// The pass ends: returns the blocks the running scope's end completes, and forgets every
    /// use (the caller then finishes whatever is left).
    fn pass_ended(&self) -> Vec<usize> {
        let active = self.state.borrow_mut().active.take();
        let done = active.map_or_else(Vec::new, |a| self.end_scope(&a));
        let mut s = self.state.borrow_mut();
        s.pending.iter_mut().for_each(|p| *p = 0);
        s.in_backward = false;
        done
    }

    /// Ends the pass: `finish` runs for the blocks the running scope's end completes, then for
    /// every one of the `n` blocks (it must pass over those already finished).
    pub(super) fn end_pass(
        &self,
        n: usize,
        mut finish: impl FnMut(usize) -> Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        for b in self.pass_ended() {
            finish(b)?;
        }
        (0..n).try_for_each(finish)
    }

    /// One pending use less for each of `blocks`; those with none left.
    fn end_scope(&self, blocks: &[usize]) -> Vec<usize> {
        let mut s = self.state.borrow_mut();
        blocks
            .iter()
            .copied()
            .filter(|&b| {
                s.pending[b] = s.pending[b].saturating_sub(1);
                s.pending[b] == 0
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_complete_when_backward_has_left_its_last_scope() {
        // Forward: embedding [0], blocks [1], [2], a head reading [3] and the tied [0].
        let uses = BlockUses::new(4);
        for scope in [&[0][..], &[1], &[2], &[3, 0]] {
            assert!(!uses.forward_ended(scope, true));
        }
        // Backward runs the scopes in reverse: each one's start completes the previous one's
        // blocks, except the embedding, still read by its own scope.
        assert_eq!(uses.backward_begins(&[3, 0]), Vec::<usize>::new());
        assert_eq!(uses.backward_begins(&[2]), vec![3]);
        assert_eq!(uses.backward_begins(&[1]), vec![2]);
        assert_eq!(uses.backward_begins(&[0]), vec![1]);
        assert_eq!(uses.pass_ended(), vec![0]);
    }

    #[test]
    fn a_recompute_inside_backward_counts_its_uses_again() {
        // Blocks 1 and 2 in one checkpointed segment between an embedding [0] and a head [3]:
        // in forward the segment's scopes run without a tape (the checkpoint keeps only its
        // input), so they record no use.
        let uses = BlockUses::new(4);
        assert!(!uses.forward_ended(&[0], true));
        assert!(!uses.forward_ended(&[1], false));
        assert!(!uses.forward_ended(&[2], false));
        assert!(!uses.forward_ended(&[3], true));
        assert!(uses.backward_begins(&[3]).is_empty());
        // Backward reaches the segment and re-runs it on a sub-tape: uses recorded now.
        assert!(
            uses.forward_ended(&[1], true),
            "a recompute runs inside backward"
        );
        assert!(uses.forward_ended(&[2], true));
        assert_eq!(uses.backward_begins(&[2]), vec![3]);
        assert_eq!(uses.backward_begins(&[1]), vec![2]);
        assert_eq!(uses.backward_begins(&[0]), vec![1]);
        assert_eq!(uses.pass_ended(), vec![0]);
        // A forward without a tape (evaluation) records no use.
        let uses = BlockUses::new(1);
        assert!(!uses.forward_ended(&[0], false));
        assert!(uses.pass_ended().is_empty());
    }
}
