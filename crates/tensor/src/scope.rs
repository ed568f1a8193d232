//! Parameter scopes: `param_scope(blocks, x, f)` runs `f`, the part of a model's forward that
//! reads the parameter blocks `blocks` (indices into the model's block list), between two calls
//! of the thread's [`BlockHooks`], and leaves an identity marker on the tape after it whose
//! backward calls the hooks again just before backward enters those blocks. That is where a
//! sharded run gathers a block's parameters before it computes and frees them after (ZeRO-3,
//! FSDP's pre- and post-forward hooks and its pre-backward hook), and where it learns that a
//! block's gradient is complete (the next scope's backward starts, or backward ends).
//!
//! Without hooks installed a scope is a plain call and records nothing.
//!
//! Not for: what the hooks do (the train crate's ZeRO code) or checkpoint scopes (`checkpoint`):
//! a checkpoint's recompute runs the scopes inside it again, so their hooks run again too.

use crate::backprop::Op;
use crate::error::Result;
use crate::tape::{record, will_record};
use crate::tensor::Tensor;
use std::cell::RefCell;
use std::rc::Rc;

/// What a sharded run does around the scopes of a model's forward and backward.
pub trait BlockHooks {
    /// The scope's blocks are about to compute in forward (also inside a recompute).
    fn before_forward(&self, blocks: &[usize]) -> Result<()>;
    /// The scope's forward is done; `marked` says whether a marker was recorded on a tape (its
    /// backward will call [`BlockHooks::before_backward`]).
    fn after_forward(&self, blocks: &[usize], marked: bool) -> Result<()>;
    /// Backward reached the scope's output: the blocks' gradients are computed next.
    fn before_backward(&self, blocks: &[usize]) -> Result<()>;
}

thread_local! {
    static HOOKS: RefCell<Option<Rc<dyn BlockHooks>>> = const { RefCell::new(None) };
}

/// Runs `f` with `hooks` called around every parameter scope of this thread (forward and
/// backward both have to run inside it for the markers to reach the hooks).
pub fn with_block_hooks<R>(hooks: Rc<dyn BlockHooks>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Rc<dyn BlockHooks>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            HOOKS.with(|h| *h.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(HOOKS.with(|h| h.borrow_mut().replace(hooks)));
    f()
}

fn current() -> Option<Rc<dyn BlockHooks>> {
    HOOKS.with(|h| h.borrow().clone())
}

/// Runs `f(x)`, the computation that reads parameter blocks `blocks`, inside a scope.
pub fn param_scope(
    blocks: &[usize],
    x: &Tensor,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let Some(hooks) = current() else {
        return f(x);
    };
    hooks.before_forward(blocks)?;
    let y = f(x);
    let marked = y.as_ref().is_ok_and(|y| will_record(&[y]));
    hooks.after_forward(blocks, marked)?;
    let y = y?;
    let marker = y.detach();
    let blocks = blocks.to_vec();
    Ok(record(marker, &[&y], move || Op::ScopeMarker { blocks }))
}

/// The marker's rule: tell the hooks, pass the gradient through.
pub(crate) fn marker_backward(blocks: &[usize], dy: &Tensor) -> Result<Vec<Option<Tensor>>> {
    if let Some(hooks) = current() {
        hooks.before_backward(blocks)?;
    }
    Ok(vec![Some(dy.clone())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Gradients, Tape};
    use headroom_memory::{AllocatorConfig, Category, Device};
    use std::cell::RefCell;

    #[derive(Default)]
    struct Log(RefCell<Vec<String>>);

    impl BlockHooks for Log {
        fn before_forward(&self, b: &[usize]) -> Result<()> {
            self.0.borrow_mut().push(format!("f+{b:?}"));
            Ok(())
        }
        fn after_forward(&self, b: &[usize], marked: bool) -> Result<()> {
            assert!(marked, "the test records every scope");
            self.0.borrow_mut().push(format!("f-{b:?}"));
            Ok(())
        }
        fn before_backward(&self, b: &[usize]) -> Result<()> {
            self.0.borrow_mut().push(format!("b+{b:?}"));
            Ok(())
        }
    }

    #[test]
    fn hooks_run_in_forward_order_then_in_reverse_in_backward() {
        let device = Device::cpu(16 << 20, AllocatorConfig::default());
        let w = Tensor::from_f32(
            &device,
            &[2],
            &[2.0, 3.0],
            DType::F32,
            Category::Parameter,
            None,
        )
        .unwrap()
        .track();
        let x = Tensor::from_f32(
            &device,
            &[2],
            &[1.0, 1.0],
            DType::F32,
            Category::Input,
            None,
        )
        .unwrap();
        let log = Rc::new(Log::default());
        let tape = Tape::new();
        let mut grads = Gradients::new();
        with_block_hooks(log.clone(), || {
            let y = tape
                .record(|| {
                    let h = param_scope(&[0], &x, |x| x.mul(&w))?;
                    let h = param_scope(&[1, 0], &h, |h| h.mul(&w))?;
                    h.sum_all()
                })
                .unwrap();
            tape.backward(&y, &mut grads).unwrap();
        });
        assert_eq!(
            *log.0.borrow(),
            [
                "f+[0]", "f-[0]", "f+[1, 0]", "f-[1, 0]", "b+[1, 0]", "b+[0]"
            ]
        );
        // y = Σ x·w², dy/dw = 2·x·w: the marker passes gradients through unchanged.
        assert_eq!(grads.get(&w).unwrap().to_vec_f32().unwrap(), [4.0, 6.0]);
    }
}
