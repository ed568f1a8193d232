//! Placement of the model states: the ZeRO stage over the data-parallel group (which states are
//! sharded) and the tier each offloadable state lives on. ZeRO stages and offload are placements,
//! not separate engines (Rajbhandari et al. 2020, "ZeRO"; Ren et al. 2021, "ZeRO-Offload";
//! Rajbhandari et al. 2021, "ZeRO-Infinity").
//!
//! Not for: the bytes each placement leaves on a device (the cost model, the dry run).

use crate::StrategyError;
use crate::named::named_enum;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// ZeRO stage: 0 replicates every state (DDP); 1 shards optimizer states and master weights; 2
/// also gradients; 3 also parameters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(into = "u8")]
pub struct ZeroStage(u8);

impl ZeroStage {
    pub const ALL: [ZeroStage; 4] = [ZeroStage(0), ZeroStage(1), ZeroStage(2), ZeroStage(3)];
    const FLAG: &'static str = "--zero";

    /// The stage numbered `n`, if it exists.
    pub fn new(n: u8) -> Result<ZeroStage, StrategyError> {
        if n <= 3 {
            Ok(ZeroStage(n))
        } else {
            Err(StrategyError::Value {
                flag: ZeroStage::FLAG,
                value: n.to_string(),
                accepted: "0, 1, 2, 3".into(),
            })
        }
    }

    /// The stage number.
    pub const fn number(self) -> u8 {
        self.0
    }
    /// Optimizer states (and master weights) are sharded.
    pub const fn shards_optimizer(self) -> bool {
        self.0 >= 1
    }
    /// Gradients are sharded (reduce-scatter instead of all-reduce).
    pub const fn shards_gradients(self) -> bool {
        self.0 >= 2
    }
    /// Parameters are sharded and gathered per unit before use.
    pub const fn shards_parameters(self) -> bool {
        self.0 >= 3
    }
    /// Stages 1 and 2: each rank updates its shard of parameters that every rank holds whole,
    /// and the updated shards are all-gathered after the step (stage 3 keeps them sharded).
    pub const fn gathers_updated_parameters(self) -> bool {
        self.shards_optimizer() && !self.shards_parameters()
    }
}

impl From<ZeroStage> for u8 {
    fn from(z: ZeroStage) -> u8 {
        z.0
    }
}

impl fmt::Display for ZeroStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for ZeroStage {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, StrategyError> {
        let bad = || StrategyError::Value {
            flag: ZeroStage::FLAG,
            value: s.to_string(),
            accepted: "0, 1, 2, 3".into(),
        };
        ZeroStage::new(s.parse().map_err(|_| bad())?).map_err(|_| bad())
    }
}

impl<'de> Deserialize<'de> for ZeroStage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ZeroStage::new(u8::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

named_enum!(
    /// Where an offloaded model state lives.
    #[derive(Default)]
    Offload, "--offload-optimizer/--offload-params", {
        /// On the device.
        #[default]
        None = "none",
        /// Host memory.
        Cpu = "cpu",
        /// Files on NVMe.
        Nvme = "nvme",
    }
);

impl Offload {
    /// Whether the state leaves the device.
    pub fn is_offloaded(self) -> bool {
        self != Offload::None
    }
}

/// Where each model state lives. Serialises flat into a strategy (`zero_stage`,
/// `offload_optimizer`, `offload_params`, `offload_activations`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub zero_stage: ZeroStage,
    /// Tier of optimizer states, master weights and (while the step runs) fp32 gradients.
    pub offload_optimizer: Offload,
    /// Tier of the parameters (ZeRO-3 only).
    pub offload_params: Offload,
    /// Tier of the inputs kept by checkpointed blocks (DeepSpeed's `cpu_checkpointing`): copied
    /// to host memory in forward, fetched back when backward recomputes the block.
    #[serde(default)]
    pub offload_activations: Offload,
}

impl Placement {
    /// Why this placement cannot run, following DeepSpeed's rules (docs/sources.md §8):
    /// parameter offload needs ZeRO-3 and optimizer offload; optimizer offload needs ZeRO ≥ 1.
    pub fn incompatibility(&self) -> Option<String> {
        if self.offload_params.is_offloaded() && !self.zero_stage.shards_parameters() {
            return Some(
                "--offload-params needs --zero 3 (parameters are only sharded at stage 3)".into(),
            );
        }
        if self.offload_params.is_offloaded() && !self.offload_optimizer.is_offloaded() {
            return Some("--offload-params needs --offload-optimizer cpu or nvme as well".into());
        }
        if self.offload_optimizer.is_offloaded() && !self.zero_stage.shards_optimizer() {
            return Some("--offload-optimizer needs --zero 1, 2 or 3".into());
        }
        if self.offload_activations == Offload::Nvme {
            return Some(
                "--offload-activations takes cpu or none: checkpointed inputs are fetched back \
                 once per block in backward, which host memory serves and NVMe does not \
                 (DeepSpeed's cpu_checkpointing is host memory too)"
                    .into(),
            );
        }
        None
    }

    /// Whether any model state (parameters, gradients, optimizer states) is sharded or
    /// offloaded; activation offload alone moves none.
    pub fn moves_model_states(&self) -> bool {
        self.zero_stage.number() > 0
            || self.offload_optimizer.is_offloaded()
            || self.offload_params.is_offloaded()
    }

    /// Whether this is the single-device placement (stage 0, nothing offloaded).
    pub fn is_local(&self) -> bool {
        *self == Placement::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_shard_cumulatively() {
        let [z0, z1, z2, z3] = ZeroStage::ALL;
        assert!(!z0.shards_optimizer());
        assert!(z1.shards_optimizer() && !z1.shards_gradients());
        assert!(z2.shards_gradients() && !z2.shards_parameters());
        assert!(z3.shards_parameters());
        assert!(
            "4".parse::<ZeroStage>()
                .unwrap_err()
                .to_string()
                .contains("0, 1, 2, 3")
        );
    }

    #[test]
    fn parameter_offload_needs_stage_three_and_optimizer_offload() {
        let p = Placement {
            zero_stage: ZeroStage::new(2).unwrap(),
            offload_optimizer: Offload::Cpu,
            offload_params: Offload::Cpu,
            offload_activations: Offload::None,
        };
        assert!(p.incompatibility().unwrap().contains("--zero 3"));
        let p = Placement {
            zero_stage: ZeroStage::new(3).unwrap(),
            offload_optimizer: Offload::None,
            offload_params: Offload::Nvme,
            offload_activations: Offload::None,
        };
        assert!(p.incompatibility().unwrap().contains("--offload-optimizer"));
        let p = Placement {
            offload_optimizer: Offload::Cpu,
            ..Placement::default()
        };
        assert!(p.incompatibility().unwrap().contains("--zero 1, 2 or 3"));
    }

    #[test]
    fn activations_offload_to_host_memory_only() {
        let p = |tier| Placement {
            offload_activations: tier,
            ..Placement::default()
        };
        assert_eq!(p(Offload::Cpu).incompatibility(), None);
        assert!(!p(Offload::Cpu).is_local());
        assert!(
            p(Offload::Nvme)
                .incompatibility()
                .unwrap()
                .contains("cpu or none")
        );
    }
}
