//! Autocast: a scoped mixed-precision policy after PyTorch's (aten/src/ATen/autocast_mode.cpp;
//! docs/sources.md §4). Inside `autocast(DType::BF16, …)` (or F16):
//! - lower precision: `matmul` casts f32 operands to the autocast dtype;
//! - fp32: softmax, log-softmax, layer norm, RMS norm and cross-entropy cast 16-bit inputs
//!   (and norm weights) to f32 and return f32;
//! - promote: add, sub, mul and div with mixed float dtypes run in the widest of the two.
//!
//! Casts are recorded ops, so gradients flow back to f32 parameters in f32. Unlike PyTorch there
//! is no cast cache: a weight used twice is cast twice. Backward runs with autocast off (its
//! dtypes follow the forward's), and a checkpoint scope re-runs under the autocast state it was
//! recorded with.
//!
//! Not for: loss scaling or master weights (the nn/train crates).

use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;
use std::cell::Cell;

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Runs `f` with autocast to `dtype` (`BF16` or `F16`; any other dtype turns autocast off).
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> R) -> R {
    let low = matches!(dtype, DType::BF16 | DType::F16).then_some(dtype);
    with_state(low, f)
}

/// The autocast dtype in effect on this thread, if any.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(|a| a.get())
}

/// Runs `f` with a given autocast state (None: off), restoring the previous one after.
pub(crate) fn with_state<R>(state: Option<DType>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            AUTOCAST.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(AUTOCAST.with(|a| a.replace(state)));
    f()
}

/// Lower-precision policy: both operands in the autocast dtype, if autocast would change one.
pub(crate) fn lower_pair(a: &Tensor, b: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    let Some(low) = autocast_dtype() else {
        return Ok(None);
    };
    if a.dtype() == low && b.dtype() == low || !a.dtype().is_float() || !b.dtype().is_float() {
        return Ok(None);
    }
    Ok(Some((a.cast(low)?, b.cast(low)?)))
}

/// A linear layer's bias under the lower-precision policy: cast to the autocast dtype when it
/// is a float of another dtype, so the 16-bit product is not widened back to meet it.
pub(crate) fn lower_bias(b: &Tensor) -> Result<Tensor> {
    match autocast_dtype() {
        Some(low) if b.dtype().is_float() && b.dtype() != low => b.cast(low),
        _ => Ok(b.clone()),
    }
}

/// fp32 policy: the tensors in f32, if autocast is on and any of them is 16-bit.
pub(crate) fn fp32_all(ts: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    if autocast_dtype().is_none()
        || ts
            .iter()
            .all(|t| t.dtype() != DType::BF16 && t.dtype() != DType::F16)
    {
        return Ok(None);
    }
    Ok(Some(
        ts.iter()
            .map(|t| t.cast(DType::F32))
            .collect::<Result<_>>()?,
    ))
}

/// Promote policy: mixed float dtypes meet in the widest (f32 beats 16-bit; bf16 and f16 meet
/// in f32).
pub(crate) fn promote_pair(a: &Tensor, b: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    if autocast_dtype().is_none()
        || a.dtype() == b.dtype()
        || !a.dtype().is_float()
        || !b.dtype().is_float()
    {
        return Ok(None);
    }
    Ok(Some((a.cast(DType::F32)?, b.cast(DType::F32)?)))
}
