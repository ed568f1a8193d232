//! Low-rank adaptation (LoRA, Hu et al. 2021) as the CLI, the TOML and the JSON spell it: the
//! base weights are frozen (no gradient, no optimizer state) and each targeted projection
//! `y = x·W` gains a trainable low-rank update `y = x·W + (α/r)·(x·A)·B`, with `A` of shape
//! (in, r) and `B` of shape (r, out); `B` starts at zero, so training starts from the base model.
//! QLoRA (Dettmers et al. 2023) also stores the frozen projections in 4-bit NormalFloat.
//!
//! Target names follow the projections of a transformer block as PEFT's `target_modules` name
//! them for Llama (`q_proj` … `down_proj`, written without `_proj`), plus `qkv` for a fused
//! query-key-value projection (GPT-2's `c_attn`, headroom's GPT). On a model whose q, k and v
//! are separate, `qkv` means all three.
//!
//! Not for: the adapters' arithmetic (the nn crate) or their bytes (the planner, the dry run).

use crate::StrategyError;
use crate::named::{named_enum, serde_by_name};
use std::fmt;
use std::str::FromStr;

named_enum!(
    /// A projection of a transformer block that LoRA can adapt.
    LoraTarget, "--lora-targets", {
        /// The query projection (PEFT `q_proj`).
        Q = "q",
        /// The key projection (`k_proj`).
        K = "k",
        /// The value projection (`v_proj`).
        V = "v",
        /// The fused query-key-value projection (GPT-2's `c_attn`); q, k and v on models that
        /// keep them apart.
        Qkv = "qkv",
        /// The attention output projection (`o_proj`; GPT-2's `attn.c_proj`).
        O = "o",
        /// The gate projection of a gated MLP (`gate_proj`).
        Gate = "gate",
        /// The MLP's up projection (`up_proj`; GPT-2's `mlp.c_fc`).
        Up = "up",
        /// The MLP's down projection (`down_proj`; GPT-2's `mlp.c_proj`).
        Down = "down",
    }
);

named_enum!(
    #[derive(Default)]
    /// How the frozen base weights of a LoRA run are stored.
    BaseWeights, "--lora-base", {
        /// In the run's parameter dtype (plain LoRA).
        #[default]
        Plain = "plain",
        /// Targeted and untargeted projections in 4-bit NormalFloat with double-quantised
        /// block scales (QLoRA); embeddings, norms and the output head stay in the parameter
        /// dtype, as bitsandbytes leaves them.
        Nf4 = "nf4",
    }
);

named_enum!(
    /// The dtype a LoRA run loads its frozen base in (`torch_dtype` of `from_pretrained`), where
    /// it is given: PEFT's FSDP example loads it in fp32 under bf16 mixed precision.
    BaseDtype, "--lora-base-dtype", {
        Fp32 = "fp32",
        Bf16 = "bf16",
        Fp16 = "fp16",
    }
);

impl BaseDtype {
    /// Bytes per element.
    pub const fn bytes(self) -> u64 {
        match self {
            BaseDtype::Fp32 => 4,
            BaseDtype::Bf16 | BaseDtype::Fp16 => 2,
        }
    }
}

/// A set of LoRA targets, written comma-separated (`q,v`), kept sorted and without repeats.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LoraTargets(Vec<LoraTarget>);

impl LoraTargets {
    /// The accepted spellings.
    pub const ACCEPTED: &'static str = "a comma-separated list of q, k, v, qkv, o, gate, up, down (or PEFT's q_proj, …, down_proj), or all-linear (e.g. q,v)";

    /// The targets in a fixed order, without repeats; at least one.
    pub fn new(targets: &[LoraTarget]) -> Result<LoraTargets, StrategyError> {
        let mut t = targets.to_vec();
        t.sort();
        t.dedup();
        if t.is_empty() {
            return Err(StrategyError::Value {
                flag: LoraTarget::FLAG,
                value: String::new(),
                accepted: LoraTargets::ACCEPTED.to_string(),
            });
        }
        Ok(LoraTargets(t))
    }

    /// Every linear projection of a block (PEFT's `all-linear`, the output head excepted).
    pub fn all_linear() -> LoraTargets {
        LoraTargets(vec![
            LoraTarget::Qkv,
            LoraTarget::O,
            LoraTarget::Gate,
            LoraTarget::Up,
            LoraTarget::Down,
        ])
    }

    pub fn as_slice(&self) -> &[LoraTarget] {
        &self.0
    }

    pub fn contains(&self, target: LoraTarget) -> bool {
        self.0.contains(&target)
    }

    /// Whether the query (`q`), key or value projection is adapted, alone or through `qkv`.
    pub fn adapts_attention_input(&self, target: LoraTarget) -> bool {
        self.contains(target) || self.contains(LoraTarget::Qkv)
    }
}

impl Default for LoraTargets {
    /// PEFT's default for Llama-family models: the query and value projections.
    fn default() -> LoraTargets {
        LoraTargets(vec![LoraTarget::Q, LoraTarget::V])
    }
}

impl fmt::Display for LoraTargets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|t| t.name()).collect();
        f.write_str(&names.join(","))
    }
}

impl FromStr for LoraTargets {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<LoraTargets, StrategyError> {
        if s.trim() == "all-linear" {
            return Ok(LoraTargets::all_linear());
        }
        let parsed = s
            .split(',')
            .map(|t| {
                // PEFT's module names (`q_proj`, …, `down_proj`) name the same projections.
                let t = t.trim();
                t.strip_suffix("_proj")
                    .unwrap_or(t)
                    .parse::<LoraTarget>()
                    .map_err(|_| StrategyError::Value {
                        flag: LoraTarget::FLAG,
                        value: s.to_string(),
                        accepted: LoraTargets::ACCEPTED.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        LoraTargets::new(&parsed).map_err(|_| StrategyError::Value {
            flag: LoraTarget::FLAG,
            value: s.to_string(),
            accepted: LoraTargets::ACCEPTED.to_string(),
        })
    }
}

serde_by_name!(LoraTargets);

/// A LoRA (or QLoRA) fine-tune: which projections get adapters, of what rank and scale, and how
/// the frozen base is stored.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lora {
    /// The adapters' rank r (at least 1).
    pub rank: usize,
    /// The scale's numerator: updates are multiplied by α/r.
    pub alpha: f32,
    #[serde(default)]
    pub targets: LoraTargets,
    #[serde(default)]
    pub base: BaseWeights,
}

impl Lora {
    /// The largest rank accepted (beyond it an adapter is no longer low-rank for any model
    /// headroom knows, and the counts would only be a typo).
    pub const MAX_RANK: usize = 65_536;

    /// Checks the rank and the scale; a bad one names the flag.
    pub fn new(
        rank: usize,
        alpha: f32,
        targets: LoraTargets,
        base: BaseWeights,
    ) -> Result<Lora, StrategyError> {
        if rank == 0 || rank > Lora::MAX_RANK {
            return Err(StrategyError::Value {
                flag: "--lora-rank",
                value: rank.to_string(),
                accepted: format!("an integer from 1 to {}", Lora::MAX_RANK),
            });
        }
        if !alpha.is_finite() || alpha <= 0.0 {
            return Err(StrategyError::Value {
                flag: "--lora-alpha",
                value: alpha.to_string(),
                accepted: "a positive number (the update is scaled by alpha/rank)".to_string(),
            });
        }
        Ok(Lora {
            rank,
            alpha,
            targets,
            base,
        })
    }

    /// The factor the low-rank update is multiplied by: α/r.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }

    /// Trainable elements of one adapter on a projection from `input` to `output` features:
    /// A is input × r, B is r × output.
    pub fn adapter_params(&self, input: usize, output: usize) -> usize {
        self.rank * (input + output)
    }
}

impl fmt::Display for Lora {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.base {
            BaseWeights::Plain => "LoRA",
            BaseWeights::Nf4 => "QLoRA (NF4 base)",
        };
        write!(
            f,
            "{kind} rank {} alpha {} on {}",
            self.rank, self.alpha, self.targets
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_sorted_without_repeats_and_print_back() {
        let t: LoraTargets = "v,q,v".parse().unwrap();
        assert_eq!(t.as_slice(), &[LoraTarget::Q, LoraTarget::V]);
        assert_eq!(t.to_string(), "q,v");
        assert_eq!(
            "all-linear".parse::<LoraTargets>().unwrap(),
            LoraTargets::all_linear()
        );
        assert_eq!(LoraTargets::default().to_string(), "q,v");
        // PEFT's module names spell the same targets.
        let peft: LoraTargets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
            .parse()
            .unwrap();
        assert_eq!(peft.to_string(), "q,k,v,o,gate,up,down");
        for bad in ["", "q,,v", "c_attn", "all", "_proj"] {
            let e = bad.parse::<LoraTargets>().unwrap_err().to_string();
            assert!(
                e.contains("--lora-targets") && e.contains("all-linear"),
                "{e}"
            );
        }
    }

    #[test]
    fn rank_and_alpha_are_checked_and_give_the_scale() {
        let l = Lora::new(8, 16.0, LoraTargets::default(), BaseWeights::Plain).unwrap();
        assert_eq!(l.scale(), 2.0);
        // Llama-2-7B's q_proj: 4096 → 4096, so A and B hold 8·4096 each.
        assert_eq!(l.adapter_params(4096, 4096), 65_536);
        assert!(Lora::new(0, 8.0, LoraTargets::default(), BaseWeights::Plain).is_err());
        let e = Lora::new(8, 0.0, LoraTargets::default(), BaseWeights::Nf4).unwrap_err();
        assert!(e.to_string().contains("--lora-alpha"), "{e}");
    }

    #[test]
    fn targets_round_trip_through_toml() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct C {
            t: LoraTargets,
            b: BaseWeights,
        }
        let c: C = toml::from_str("t = \"qkv,down\"\nb = \"nf4\"").unwrap();
        assert_eq!(c.t.as_slice(), &[LoraTarget::Qkv, LoraTarget::Down]);
        assert_eq!(c.b, BaseWeights::Nf4);
        assert_eq!(
            toml::from_str::<C>(&toml::to_string(&c).unwrap()).unwrap(),
            c
        );
    }
}
