//! Thread-local autodiff state: whether grad mode is on, the stack of tapes that record ops
//! (the innermost records; a checkpoint's recompute pushes a sub-tape), and the category new op
//! outputs are tagged with (`activation` in forward, `temporary` while backward computes
//! gradients of activations).
//!
//! Not for: the tape's contents (see `tape`).

use crate::tape::TapeInner;
use headroom_memory::Category;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static TAPES: RefCell<Vec<Rc<RefCell<TapeInner>>>> = const { RefCell::new(Vec::new()) };
    static OUTPUT_CATEGORY: Cell<Category> = const { Cell::new(Category::Activation) };
}

/// Restores a `Cell` to its previous value on drop (also on unwinding).
struct Restore<T: Copy + 'static> {
    key: &'static std::thread::LocalKey<Cell<T>>,
    old: T,
}

impl<T: Copy + 'static> Drop for Restore<T> {
    fn drop(&mut self) {
        self.key.with(|c| c.set(self.old));
    }
}

fn set_scoped<T: Copy + 'static>(
    key: &'static std::thread::LocalKey<Cell<T>>,
    value: T,
) -> Restore<T> {
    Restore {
        key,
        old: key.with(|c| c.replace(value)),
    }
}

/// Runs `f` with grad mode off: no op is recorded (evaluation, optimizer steps).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _restore = set_scoped(&GRAD_ENABLED, false);
    f()
}

/// Runs `f` with grad mode on (used by checkpoint recomputation inside backward).
pub fn enable_grad<R>(f: impl FnOnce() -> R) -> R {
    let _restore = set_scoped(&GRAD_ENABLED, true);
    f()
}

pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Runs `f` with new op outputs tagged `category`.
pub(crate) fn with_output_category<R>(category: Category, f: impl FnOnce() -> R) -> R {
    let _restore = set_scoped(&OUTPUT_CATEGORY, category);
    f()
}

pub(crate) fn output_category() -> Category {
    OUTPUT_CATEGORY.with(|c| c.get())
}

/// The tape ops record on right now: the innermost active tape, if grad mode is on.
pub(crate) fn recording_tape() -> Option<Rc<RefCell<TapeInner>>> {
    if !is_grad_enabled() {
        return None;
    }
    TAPES.with(|t| t.borrow().last().cloned())
}

/// Runs `f` with `tape` as the innermost recording tape.
pub(crate) fn with_tape<R>(tape: Rc<RefCell<TapeInner>>, f: impl FnOnce() -> R) -> R {
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            TAPES.with(|t| t.borrow_mut().pop());
        }
    }
    TAPES.with(|t| t.borrow_mut().push(tape));
    let _pop = Pop;
    f()
}
