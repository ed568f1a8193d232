//! Element types of optimizer state: f32 (the default) or bf16 (half the `optimizer_state`
//! bytes; updates still compute in f32 and round once when stored).
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
}

impl StateDtype {
    pub fn size_bytes(self) -> u64 {
        match self {
            StateDtype::F32 => 4,
            StateDtype::Bf16 => 2,
        }
    }
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
