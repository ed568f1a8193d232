//! Element types of tensor storage: f32, bf16 and f16 floats (the `half` crate) and i32/i64
//! indices, plus `Elem`, the trait the CPU kernels use to load any float type into f32
//! registers and store it back. All float math is done in f32.
//!
//! Not for: casting policy (see `autocast`).

use half::{bf16, f16};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
    I32,
    I64,
}

impl DType {
    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::I64 => 8,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A float storage type that kernels widen to f32 for arithmetic.
pub trait Elem: bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Elem for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Elem for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// Runs `$body` with `$T` bound to the Rust type of a float dtype; other dtypes evaluate `$other`.
macro_rules! with_float_type {
    ($dtype:expr, $T:ident => $body:expr, _ => $other:expr) => {
        match $dtype {
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::dtype::DType::F16 => {
                type $T = half::f16;
                $body
            }
            _ => $other,
        }
    };
}
pub(crate) use with_float_type;
