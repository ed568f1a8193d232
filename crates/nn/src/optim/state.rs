//! Element types of optimizer state: f32 (the default), bf16 (half the `optimizer_state`
//! bytes; updates still compute in f32 and round once when stored) or 8-bit block-wise codes
//! (AdamW only: a byte per element and an f32 absmax per block, see `quant8`).
//!
//! Not for: the update rules (see `sgd`, `adamw`, `lamb`).

use half::bf16;
use serde::{Deserialize, Serialize};

/// Storage type of optimizer states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StateDtype {
    #[default]
    F32,
    Bf16,
    /// 8-bit block-wise codes (Dettmers et al. 2022).
    Int8,
}

impl StateDtype {
    /// Bytes per element (for 8-bit states the code's byte; the per-block absmax comes on top).
    pub fn size_bytes(self) -> u64 {
        match self {
            StateDtype::F32 => 4,
            StateDtype::Bf16 => 2,
            StateDtype::Int8 => 1,
        }
    }
}

/// The element type of one state buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateElement {
    F32,
    Bf16,
    U8,
}

/// One state buffer of a flat buffer's optimizer state: its name, bytes and element type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateBuffer {
    pub name: String,
    pub bytes: usize,
    pub element: StateElement,
}

/// A state element: read as f32, written back rounded.
pub trait StateElem: bytemuck::Pod + Send + Sync {
    fn load(self) -> f32;
    fn store(x: f32) -> Self;
}

impl StateElem for f32 {
    #[inline]
    fn load(self) -> f32 {
        self
    }
    #[inline]
    fn store(x: f32) -> Self {
        x
    }
}

impl StateElem for bf16 {
    #[inline]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline]
    fn store(x: f32) -> Self {
        bf16::from_f32(x)
    }
}
