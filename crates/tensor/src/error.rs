//! The tensor crate's error type: every user-reachable failure (bad shapes, wrong dtypes,
//! out-of-range indices, the allocator's out-of-memory) is a `TensorError`, never a panic.
//!
//! Not for: reporting (the CLI adds context with anyhow).

use crate::dtype::DType;
use headroom_memory::OutOfMemory;

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, TensorError>;

#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("{op}: shape mismatch between {lhs:?} and {rhs:?}")]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    #[error("{op}: dtype mismatch between {lhs} and {rhs}; cast one side first (or use autocast)")]
    DTypeMismatch {
        op: &'static str,
        lhs: DType,
        rhs: DType,
    },
    #[error("{op}: dtype {dtype} is not supported here")]
    UnsupportedDType { op: &'static str, dtype: DType },
    #[error("{op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },
    #[error("{op}: index {index} is out of range for a dimension of size {size}")]
    IndexOutOfRange {
        op: &'static str,
        index: i64,
        size: usize,
    },
    #[error("{op}: tensors live on different devices")]
    DeviceMismatch { op: &'static str },
    #[error("{op}: the tensor lives on a shape-only device and has no bytes to read")]
    ShapeOnly { op: &'static str },
    #[error("backward: {0}")]
    Backward(String),
    #[error(transparent)]
    OutOfMemory(#[from] OutOfMemory),
}

impl TensorError {
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> TensorError {
        TensorError::InvalidArgument {
            op,
            msg: msg.into(),
        }
    }
}
