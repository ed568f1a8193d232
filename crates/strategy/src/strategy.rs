//! A `Strategy`: one combination of the memory levers — precision, optimizer, placement (ZeRO
//! stage and offload tiers), activation-checkpoint policy, attention, the loss computation, micro-batch and
//! accumulation. Its JSON and TOML keys are the CLI flags' names.
//!
//! Not for: what a strategy costs or which strategies to try (the planner's search).

use crate::{Attention, Checkpoint, Loss, Offload, Optimizer, Placement, Precision};
use serde::{Deserialize, Serialize};

/// One point of the strategy space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Strategy {
    pub precision: Precision,
    pub optimizer: Optimizer,
    #[serde(flatten)]
    pub placement: Placement,
    pub checkpoint: Checkpoint,
    pub attention: Attention,
    /// Plain or chunked cross-entropy (absent in older files: plain).
    #[serde(default)]
    pub loss: Loss,
    /// Samples per device per forward/backward.
    pub micro_batch: u64,
    /// Micro-batches accumulated per optimizer step.
    pub accumulation: u64,
}

impl Strategy {
    /// Samples per device per optimizer step.
    pub fn batch_per_device(&self) -> u64 {
        self.micro_batch * self.accumulation
    }

    /// Why this combination cannot run anywhere: the placement's rules, DeepSpeed's CPU
    /// optimizer (DeepSpeedCPUAdam: AdamW with fp32 states) for offloaded states, and a batch of
    /// at least one.
    pub fn incompatibility(&self) -> Option<String> {
        if let Some(why) = self.placement.incompatibility() {
            return Some(why);
        }
        if self.placement.offload_optimizer != Offload::None && self.optimizer != Optimizer::AdamW {
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

    /// Why headroom's engine cannot run this strategy (beyond [`Strategy::incompatibility`]).
    pub fn engine_incompatibility(&self) -> Option<String> {
        if let Some(why) = self.incompatibility() {
            return Some(why);
        }
        if !self.optimizer.engine_runs() {
            return Some(format!(
                "--optimizer {}: the planner models it, but the engine does not run it yet; use one of {}",
                self.optimizer,
                Optimizer::engine_accepted()
            ));
        }
        None
    }

    /// How far the numerics depart from mixed-precision AdamW: 0 for the reference semantics
    /// (fp32 or mixed precision with AdamW), +1 for pure bf16, +1 for memory-saving Adam
    /// variants, +2 for another optimizer family. Plans rank by tier first.
    pub fn fidelity_tier(&self) -> u8 {
        u8::from(self.precision == Precision::Bf16) + self.optimizer.fidelity_tier()
    }

    /// `fp32, adamw, checkpoint none, naive attention, micro-batch 16 × 1` (without the
    /// attention for a model that has none; with the placement when it is not local and the
    /// loss when it is chunked).
    pub fn describe(&self, has_attention: bool) -> String {
        let attention = if has_attention {
            format!(", {} attention", self.attention)
        } else {
            String::new()
        };
        let placement = if self.placement.is_local() {
            String::new()
        } else {
            format!(
                ", ZeRO-{} (offload optimizer {}, params {})",
                self.placement.zero_stage,
                self.placement.offload_optimizer,
                self.placement.offload_params
            )
        };
        let loss = match self.loss {
            Loss::Plain => String::new(),
            chunked => format!(", loss {chunked}"),
        };
        format!(
            "{}, {}{placement}, checkpoint {}{attention}{loss}, micro-batch {} × {}",
            self.precision, self.optimizer, self.checkpoint, self.micro_batch, self.accumulation
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ZeroStage;

    fn strategy() -> Strategy {
        Strategy {
            micro_batch: 4,
            accumulation: 2,
            ..Strategy::default()
        }
    }

    #[test]
    fn json_is_flat_with_the_flags_names() {
        let text = serde_json::to_string(&strategy()).unwrap();
        assert_eq!(
            text,
            "{\"precision\":\"fp32\",\"optimizer\":\"adamw\",\"zero_stage\":0,\
             \"offload_optimizer\":\"none\",\"offload_params\":\"none\",\"checkpoint\":\"none\",\
             \"attention\":\"naive\",\"loss\":\"plain\",\"micro_batch\":4,\"accumulation\":2}"
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["zero_stage"], 0);
        assert_eq!(json["checkpoint"], "none");
        let back: Strategy = serde_json::from_value(json).unwrap();
        assert_eq!(back, strategy());
    }

    #[test]
    fn the_engine_refuses_what_it_does_not_run() {
        let s = Strategy {
            optimizer: Optimizer::Adafactor,
            ..strategy()
        };
        assert!(s.incompatibility().is_none());
        assert!(
            s.engine_incompatibility()
                .unwrap()
                .contains("does not run it yet")
        );
        let s = Strategy {
            placement: Placement {
                zero_stage: ZeroStage::new(2).unwrap(),
                ..Placement::default()
            },
            ..strategy()
        };
        // Every ZeRO stage runs in the engine.
        assert_eq!(s.engine_incompatibility(), None);
        let zero1 = Strategy {
            placement: Placement {
                zero_stage: ZeroStage::new(1).unwrap(),
                ..Placement::default()
            },
            ..strategy()
        };
        assert_eq!(zero1.engine_incompatibility(), None);
        // LAMB too: its trust ratios' sums over the weights a shard cuts are all-reduced.
        for stage in 1..=3 {
            let lamb = Strategy {
                optimizer: Optimizer::Lamb,
                placement: Placement {
                    zero_stage: ZeroStage::new(stage).unwrap(),
                    ..Placement::default()
                },
                ..strategy()
            };
            assert_eq!(lamb.engine_incompatibility(), None, "ZeRO-{stage}");
        }
        let s = Strategy {
            optimizer: Optimizer::Lamb,
            placement: Placement {
                zero_stage: ZeroStage::new(1).unwrap(),
                offload_optimizer: Offload::Cpu,
                ..Placement::default()
            },
            ..strategy()
        };
        assert!(s.incompatibility().unwrap().contains("DeepSpeedCPUAdam"));
    }

    #[test]
    fn tiers_add_precision_and_optimizer_departures() {
        assert_eq!(strategy().fidelity_tier(), 0);
        let bf16 = Strategy {
            precision: Precision::Bf16,
            optimizer: Optimizer::AdamWBf16,
            ..strategy()
        };
        assert_eq!(bf16.fidelity_tier(), 2);
        let sgd = Strategy {
            optimizer: Optimizer::Sgd,
            ..strategy()
        };
        assert_eq!(sgd.fidelity_tier(), 2);
    }
}
