//! Activation offload: inside [`with_activation_offload`], the input a block checkpoint scope
//! keeps (`checkpoint_block`) is copied to host memory in forward and its device bytes are
//! freed; backward copies it back to a new device tensor when it recomputes the block, one
//! block at a time. DeepSpeed calls this `cpu_checkpointing` (docs: "Activation
//! Checkpointing"); torchtune's `enable_activation_offloading` does the same to every saved
//! tensor, which under checkpointing is the blocks' inputs.
//!
//! The host bytes come from a budgeted [`HostPool`]: a real buffer on a backed device, a
//! reservation of the same size on a shape-only one, so a dry run counts what a run holds.
//! Fetching back is synchronous: on this CPU backend the "device" and the host share one
//! memory system, so there is no copy engine to overlap with; the bytes still move and the
//! device's `activation` bytes drop as they would on a GPU.
//!
//! Not for: choosing which blocks are checkpointed (the caller's policy) or the checkpoint
//! mechanism itself (`checkpoint`).

use crate::context;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;
use headroom_memory::host_pool::{HostBuffer, HostPool, HostReservation};
use headroom_memory::{Category, Device};
use std::cell::RefCell;

thread_local! {
    static POOL: RefCell<Option<HostPool>> = const { RefCell::new(None) };
}

/// Runs `f` with block checkpoints keeping their inputs in `pool` (forward and backward both
/// have to run inside it for the inputs to come back).
pub fn with_activation_offload<R>(pool: HostPool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<HostPool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            POOL.with(|p| *p.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(POOL.with(|p| p.borrow_mut().replace(pool)));
    f()
}

/// The pool block checkpoints offload to on this thread, if any.
pub(crate) fn pool() -> Option<HostPool> {
    POOL.with(|p| p.borrow().clone())
}

/// Where a stashed tensor's bytes are: a buffer, or a count for a shape-only device.
enum Host {
    Bytes(HostBuffer<u8>),
    Counted(#[allow(dead_code)] HostReservation),
}

/// A tensor whose bytes live in host memory until [`Stashed::fetch`].
pub(crate) struct Stashed {
    host: Host,
    shape: Vec<usize>,
    dtype: DType,
    category: Category,
    device: Device,
    requires_grad: bool,
}

/// Copies `t` to `pool` when it is a whole storage (a block's output; a view of a larger
/// buffer stays on the device, since freeing it would free nothing). The device bytes go when
/// the last other view of `t` drops.
pub(crate) fn stash(pool: &HostPool, t: &Tensor) -> Result<Option<Stashed>> {
    let whole = t.is_contiguous()
        && t.layout().offset() == 0
        && t.numel() * t.dtype().size_in_bytes() == t.storage_bytes();
    if !whole {
        return Ok(None);
    }
    let bytes = t.storage_bytes();
    let over = |e: headroom_memory::host_pool::OverBudget| {
        TensorError::Backward(format!(
            "activation offload: a checkpointed input of {bytes} bytes does not fit the host \
             memory budget ({} of {} bytes held); raise --host-memory or set \
             --offload-activations none",
            e.held, e.budget
        ))
    };
    let device = t.device();
    let host = match device.is_backed() {
        true => {
            let mut buf = pool.alloc::<u8>(bytes).map_err(over)?;
            let guard = t.storage().read();
            let src = guard.as_bytes().expect("a backed device has bytes");
            buf.copy_from_slice(&src[..bytes]);
            Host::Bytes(buf)
        }
        false => Host::Counted(pool.reserve(bytes as u64).map_err(over)?),
    };
    crate::backend::work::host_transfer(bytes as u64);
    Ok(Some(Stashed {
        host,
        shape: t.shape().to_vec(),
        dtype: t.dtype(),
        category: t.category(),
        device,
        requires_grad: t.requires_grad(),
    }))
}

impl Stashed {
    /// A new device tensor with the stashed bytes (no autodiff identity; the caller re-tracks
    /// it), and the host bytes released.
    pub(crate) fn fetch(self) -> Result<Tensor> {
        let t = Tensor::empty_in(
            &self.device,
            &self.shape,
            self.dtype,
            self.category,
            Some("offloaded activation"),
        )?;
        if let Host::Bytes(buf) = &self.host {
            let mut guard = t.storage().write();
            let dst = guard.as_bytes_mut().expect("a backed device has bytes");
            dst[..buf.len()].copy_from_slice(buf);
        }
        crate::backend::work::host_transfer((t.numel() * t.dtype().size_in_bytes()) as u64);
        Ok(t)
    }

    /// Whether the stashed tensor required a gradient.
    pub(crate) fn requires_grad(&self) -> bool {
        self.requires_grad
    }
}

/// Whether a recording tape makes stashing worth it (outside one, nothing is kept).
pub(crate) fn active() -> Option<HostPool> {
    context::recording_tape().and(pool())
}
