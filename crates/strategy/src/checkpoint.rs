//! Activation-checkpoint policies as `--checkpoint`, the TOML and the JSON spell them: `none`;
//! `all` (every block); `every:K` (blocks 0, K, 2K, …, one in every K); `sqrt` (⌈√n⌉ segments,
//! Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"); `budget:SIZE` (the least
//! recomputation whose activation peak fits SIZE); `selective` (inside every block: keep matmul
//! outputs, recompute the core attention — Korthikanti et al. 2022, arXiv 2205.05198);
//! `selective-op` (torchtitan's per-operator policy: inside every block keep the attention
//! kernel's output and every second matmul's, recompute everything else; planned, not run by
//! headroom's engine).
//!
//! "Checkpoint" here always means activation checkpointing (recomputation); saving a run to
//! disk is called saving.
//!
//! Not for: what a policy recomputes (the engine's recompute planning) or costs (the planner).

use crate::StrategyError;
use crate::named::serde_by_name;
use headroom_memory::size::ByteSize;
use std::fmt;
use std::str::FromStr;

/// An activation-checkpointing policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Checkpoint {
    /// Keep every activation.
    #[default]
    None,
    /// Checkpoint one block in every `k` (the others keep their activations); `EveryNth(1)` is
    /// full recomputation of every block.
    EveryNth(u64),
    /// ⌈√n⌉ segments of nearly equal length, each keeping only its input.
    Sqrt,
    /// The least recomputation whose activation peak fits this many bytes.
    Budget(u64),
    /// Recompute only the core attention of every block.
    Selective,
    /// torchtitan's per-operator selective checkpointing (`activation_checkpoint.mode =
    /// "selective"`, `selective_ac_option = "op"`): every block keeps its input, the outputs of
    /// its attention kernel and of its 1st, 3rd, 5th … matmul, and recomputes the rest.
    SelectiveOp,
}

impl Checkpoint {
    /// Every block checkpointed.
    pub const ALL_BLOCKS: Checkpoint = Checkpoint::EveryNth(1);
    /// The accepted spellings.
    pub const ACCEPTED: &'static str = "none, all, every:K (K ≥ 1), sqrt, budget:SIZE (e.g. budget:64MiB), selective, selective-op";
    const FLAG: &'static str = "--checkpoint";

    /// Whether the policy recomputes anything.
    pub fn recomputes(self) -> bool {
        self != Checkpoint::None
    }

    /// Whether the policy checkpoints whole blocks (or segments of them), each keeping only its
    /// input: what activation offload moves to the host. `budget:SIZE` resolves to none or
    /// `every:K`; it counts as checkpointing and offloads whatever inputs its choice keeps.
    pub fn keeps_block_inputs(self) -> bool {
        matches!(
            self,
            Checkpoint::EveryNth(_) | Checkpoint::Sqrt | Checkpoint::Budget(_)
        )
    }
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Checkpoint::None => f.write_str("none"),
            Checkpoint::EveryNth(1) => f.write_str("all"),
            Checkpoint::EveryNth(k) => write!(f, "every:{k}"),
            Checkpoint::Sqrt => f.write_str("sqrt"),
            Checkpoint::Budget(b) => write!(f, "budget:{b}"),
            Checkpoint::Selective => f.write_str("selective"),
            Checkpoint::SelectiveOp => f.write_str("selective-op"),
        }
    }
}

impl FromStr for Checkpoint {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, StrategyError> {
        let bad = || StrategyError::Value {
            flag: Checkpoint::FLAG,
            value: s.to_string(),
            accepted: Checkpoint::ACCEPTED.to_string(),
        };
        Ok(match s {
            "none" => Checkpoint::None,
            "all" => Checkpoint::ALL_BLOCKS,
            "sqrt" => Checkpoint::Sqrt,
            "selective" => Checkpoint::Selective,
            "selective-op" => Checkpoint::SelectiveOp,
            _ => {
                if let Some(k) = s.strip_prefix("every:") {
                    match k.parse::<u64>() {
                        Ok(k) if k >= 1 => Checkpoint::EveryNth(k),
                        _ => return Err(bad()),
                    }
                } else if let Some(size) = s.strip_prefix("budget:") {
                    let b: ByteSize = size.parse().map_err(|_| bad())?;
                    Checkpoint::Budget(b.0)
                } else {
                    return Err(bad());
                }
            }
        })
    }
}

serde_by_name!(Checkpoint);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_from_their_names_and_print_back() {
        let cases = [
            ("none", Checkpoint::None),
            ("all", Checkpoint::EveryNth(1)),
            ("every:1", Checkpoint::EveryNth(1)),
            ("every:3", Checkpoint::EveryNth(3)),
            ("sqrt", Checkpoint::Sqrt),
            ("selective", Checkpoint::Selective),
            ("selective-op", Checkpoint::SelectiveOp),
            ("budget:64MiB", Checkpoint::Budget(64 << 20)),
        ];
        for (text, policy) in cases {
            assert_eq!(text.parse::<Checkpoint>().unwrap(), policy, "{text}");
        }
        for text in [
            "none",
            "all",
            "every:3",
            "sqrt",
            "selective",
            "selective-op",
        ] {
            assert_eq!(text.parse::<Checkpoint>().unwrap().to_string(), text);
        }
        assert_eq!(Checkpoint::Budget(1024).to_string(), "budget:1024");
    }

    #[test]
    fn bad_policies_name_the_flag_and_every_spelling() {
        for bad in ["every:0", "every:x", "budget:lots", "most"] {
            let e = bad.parse::<Checkpoint>().unwrap_err().to_string();
            assert!(
                e.contains("--checkpoint") && e.contains("budget:SIZE") && e.contains(bad),
                "{e}"
            );
        }
    }

    #[test]
    fn files_use_the_same_names() {
        #[derive(serde::Deserialize)]
        struct File {
            checkpoint: Checkpoint,
        }
        let f: File = toml::from_str("checkpoint = \"every:2\"").unwrap();
        assert_eq!(f.checkpoint, Checkpoint::EveryNth(2));
        let e = toml::from_str::<File>("checkpoint = \"every:0\"")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("every:K"), "{e}");
    }
}
