//! A `Strategy`: one combination of the memory levers — precision, optimizer (and its state
//! dtype), ZeRO stage over the data-parallel group, offload tier of optimizer states and of
//! parameters, activation-checkpoint policy, attention kind, micro-batch and accumulation.
//! The names are those of the CLI flags, the JSON and the headroom TOML.
//!
//! Not for: what a strategy costs (see `cost`) or which strategies exist (see `search`).

use crate::error::{PlanError, Result};
use serde::{Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Declares a CLI/JSON-named enum with `FromStr`, `Display`, `Serialize` and `ALL`.
macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident, $field:literal, { $($(#[$vm:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vm])* $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub const fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }
        }
        impl FromStr for $name {
            type Err = PlanError;
            fn from_str(s: &str) -> Result<Self> {
                $name::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| PlanError::StrategyValue {
                    field: $field.to_string(),
                    value: s.to_string(),
                    accepted: $name::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(", "),
                })
            }
        }
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
    };
}

named_enum!(
    /// Numeric format of weights, gradients and activations.
    Precision, "--precision", {
        /// fp32 everything (4-byte weights, gradients, activations).
        Fp32 = "fp32",
        /// bf16 weights/gradients/activations with fp32 master weights (Micikevicius et al. 2018).
        Bf16Mixed = "bf16-mixed",
        /// fp16 with fp32 master weights and loss scaling.
        Fp16Mixed = "fp16-mixed",
        /// Pure bf16: no fp32 master copy (torchtune-style), optimizer states in bf16.
        Bf16 = "bf16",
    }
);

named_enum!(
    /// The optimizer, which fixes the optimizer-state bytes per parameter.
    Optimizer, "--optimizer", {
        Sgd = "sgd",
        SgdMomentum = "sgd-momentum",
        /// AdamW with states in the master dtype (fp32 under mixed precision).
        AdamW = "adamw",
        /// AdamW with bf16 momentum and variance.
        AdamWBf16 = "adamw-bf16",
        /// bitsandbytes 8-bit AdamW (Dettmers et al. 2022): uint8 states + fp32 absmax per 2048.
        AdamW8bit = "adamw-8bit",
        /// Adafactor without momentum (Shazeer & Stern 2018): factored second moment.
        Adafactor = "adafactor",
        Lamb = "lamb",
    }
);

named_enum!(
    /// Where an offloaded model state lives.
    Offload, "--offload-optimizer/--offload-params", {
        None = "none",
        Cpu = "cpu",
        Nvme = "nvme",
    }
);

named_enum!(
    /// Attention implementation.
    Attention, "--attention", {
        /// Scores and probabilities materialised (s² per head).
        Naive = "naive",
        /// Flash/memory-efficient attention: O(s) extra memory.
        MemoryEfficient = "memory-efficient",
    }
);

/// Activation checkpointing policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Checkpoint {
    /// Keep every activation.
    None,
    /// Checkpoint one block in every `k` (the others keep their activations); `EveryNth(1)` is
    /// full recomputation of every block.
    EveryNth(u64),
    /// Korthikanti et al. selective recomputation: recompute only the core attention.
    Selective,
}

impl Checkpoint {
    /// Every block checkpointed.
    pub const ALL_BLOCKS: Checkpoint = Checkpoint::EveryNth(1);
    const ACCEPTED: &'static str = "none, all, every:K (K ≥ 1), selective";
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Checkpoint::None => f.write_str("none"),
            Checkpoint::EveryNth(1) => f.write_str("all"),
            Checkpoint::EveryNth(k) => write!(f, "every:{k}"),
            Checkpoint::Selective => f.write_str("selective"),
        }
    }
}

impl FromStr for Checkpoint {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self> {
        let err = || PlanError::StrategyValue {
            field: "--checkpoint".into(),
            value: s.to_string(),
            accepted: Checkpoint::ACCEPTED.into(),
        };
        match s {
            "none" => Ok(Checkpoint::None),
            "all" => Ok(Checkpoint::ALL_BLOCKS),
            "selective" => Ok(Checkpoint::Selective),
            _ => {
                let k = s.strip_prefix("every:").ok_or_else(err)?;
                match k.parse::<u64>() {
                    Ok(k) if k >= 1 => Ok(Checkpoint::EveryNth(k)),
                    _ => Err(err()),
                }
            }
        }
    }
}

impl Serialize for Checkpoint {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One point of the strategy space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Strategy {
    pub precision: Precision,
    pub optimizer: Optimizer,
    /// ZeRO stage over the data-parallel group: 1 shards optimizer states (and master weights),
    /// 2 also gradients, 3 also parameters.
    pub zero_stage: u8,
    pub offload_optimizer: Offload,
    pub offload_params: Offload,
    pub checkpoint: Checkpoint,
    pub attention: Attention,
    /// Samples per device per forward/backward.
    pub micro_batch: u64,
    /// Micro-batches accumulated per optimizer step.
    pub accumulation: u64,
}

impl Strategy {
    /// Why this combination cannot run, following DeepSpeed's rules (techniques.md §4.5):
    /// parameter offload needs ZeRO-3 and optimizer offload; optimizer offload needs ZeRO ≥ 1
    /// and an optimizer with a CPU implementation (DeepSpeedCPUAdam: AdamW with fp32 states).
    pub fn incompatibility(&self) -> Option<String> {
        if self.zero_stage > 3 {
            return Some(format!(
                "--zero {} does not exist; accepted: 0, 1, 2, 3",
                self.zero_stage
            ));
        }
        if self.offload_params != Offload::None && self.zero_stage != 3 {
            return Some(
                "--offload-params needs --zero 3 (parameters are only sharded at stage 3)".into(),
            );
        }
        if self.offload_params != Offload::None && self.offload_optimizer == Offload::None {
            return Some("--offload-params needs --offload-optimizer cpu or nvme as well".into());
        }
        if self.offload_optimizer != Offload::None && self.zero_stage == 0 {
            return Some("--offload-optimizer needs --zero 1, 2 or 3".into());
        }
        if self.offload_optimizer != Offload::None && self.optimizer != Optimizer::AdamW {
            return Some(format!(
                "--offload-optimizer runs the step on the CPU (DeepSpeedCPUAdam), which needs --optimizer adamw, not {}",
                self.optimizer
            ));
        }
        if self.micro_batch == 0 || self.accumulation == 0 {
            return Some("micro-batch and accumulation must be at least 1".into());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>().unwrap(), *p);
        }
        for c in ["none", "all", "every:3", "selective"] {
            assert_eq!(c.parse::<Checkpoint>().unwrap().to_string(), c);
        }
        assert_eq!(
            "every:1".parse::<Checkpoint>().unwrap(),
            Checkpoint::ALL_BLOCKS
        );
    }

    #[test]
    fn bad_values_list_what_is_accepted() {
        let e = "adam".parse::<Optimizer>().unwrap_err().to_string();
        assert!(e.contains("--optimizer") && e.contains("adamw-8bit"), "{e}");
        let e = "every:0".parse::<Checkpoint>().unwrap_err().to_string();
        assert!(e.contains("every:K"), "{e}");
    }
}
