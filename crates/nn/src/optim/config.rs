//! The optimizer's settings: which update rule, its hyperparameters (PyTorch's defaults where
//! they exist) and its state format, and how a vocabulary optimizer maps onto them.
//!
//! Not for: the optimizer and its state (see the parent `optim`).

use super::StateDtype;
use serde::{Deserialize, Serialize};

/// Which update rule the engine applies (the vocabulary's `Optimizer` picks one, with its
/// momentum and state format, through [`OptimizerConfig::for_strategy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpdateRule {
    Sgd,
    AdamW,
    Lamb,
    Adafactor,
}

impl UpdateRule {
    /// Full-size state tensors per parameter (Adafactor's factored state has none).
    pub fn states_per_param(self, momentum: f32) -> usize {
        match self {
            UpdateRule::Sgd if momentum == 0.0 => 0,
            UpdateRule::Sgd => 1,
            UpdateRule::AdamW | UpdateRule::Lamb => 2,
            UpdateRule::Adafactor => 0,
        }
    }

    pub(super) fn state_names(self) -> &'static [&'static str] {
        match self {
            UpdateRule::Sgd => &["momentum_buffer"],
            UpdateRule::AdamW | UpdateRule::Lamb => &["exp_avg", "exp_avg_sq"],
            UpdateRule::Adafactor => &["exp_avg_sq_factored"],
        }
    }
}

/// Optimizer hyperparameters (PyTorch's defaults where they exist).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    pub kind: UpdateRule,
    pub weight_decay: f32,
    pub momentum: f32,
    pub nesterov: bool,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub state_dtype: StateDtype,
    /// States live on the host between updates, paged onto the device per flat buffer
    /// (`paged-adamw-8bit`; see `paged`).
    #[serde(default)]
    pub paged: bool,
}

impl OptimizerConfig {
    pub fn new(kind: UpdateRule) -> Self {
        let (weight_decay, eps) = match kind {
            UpdateRule::Sgd => (0.0, 1e-8),
            UpdateRule::AdamW => (0.01, 1e-8),
            UpdateRule::Lamb => (0.01, 1e-6),
            // Hugging Face's Adafactor: no decay; its ε₁ is fixed (`adafactor::EPS1`).
            UpdateRule::Adafactor => (0.0, 1e-30),
        };
        OptimizerConfig {
            kind,
            weight_decay,
            momentum: if kind == UpdateRule::Sgd { 0.9 } else { 0.0 },
            nesterov: false,
            beta1: 0.9,
            beta2: 0.999,
            eps,
            state_dtype: StateDtype::F32,
            paged: false,
        }
    }

    /// The engine's configuration of a vocabulary optimizer under `precision`: the update rule,
    /// momentum (none for plain SGD) and the state format (bf16 for `adamw-bf16` and under pure
    /// bf16; Adafactor's factored state is always f32).
    pub fn for_strategy(
        optimizer: headroom_strategy::Optimizer,
        precision: headroom_strategy::Precision,
    ) -> Self {
        use headroom_strategy::{NumberFormat, Optimizer as O};
        let rule = match optimizer {
            O::Sgd | O::SgdMomentum => UpdateRule::Sgd,
            O::AdamW | O::AdamWBf16 | O::AdamW8bit | O::PagedAdamW8bit => UpdateRule::AdamW,
            O::Lamb => UpdateRule::Lamb,
            O::Adafactor => UpdateRule::Adafactor,
        };
        let mut c = OptimizerConfig::new(rule);
        if optimizer == O::Sgd {
            c.momentum = 0.0;
        }
        c.state_dtype = match optimizer.state_format(precision) {
            _ if matches!(optimizer, O::AdamW8bit | O::PagedAdamW8bit) => StateDtype::Int8,
            _ if optimizer == O::Adafactor => StateDtype::F32,
            NumberFormat::Bf16 => StateDtype::Bf16,
            NumberFormat::F32 | NumberFormat::F16 => StateDtype::F32,
        };
        c.paged = optimizer == O::PagedAdamW8bit;
        c
    }
}
