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
    /// Each block's optimizer update runs in backward as soon as its gradient is complete, and
    /// the gradient's bytes go back (torchtune's `optimizer_in_bwd`; LOMO, Lv et al. 2023).
    #[serde(default)]
    pub optimizer_in_backward: bool,
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
        if self.placement.offload_activations.is_offloaded()
            && !self.checkpoint.keeps_block_inputs()
        {
            return Some(format!(
                "--offload-activations moves the inputs that checkpointed blocks keep to host \
                 memory, and --checkpoint {} checkpoints no block: use --checkpoint all, \
                 every:K, sqrt or budget:SIZE",
                self.checkpoint
            ));
        }
        if self.optimizer_in_backward {
            return self.in_backward_incompatibility();
        }
        None
    }

    /// Why the optimizer step cannot run in backward with the other levers: it updates each
    /// block as soon as its gradient is complete, so nothing may need every gradient first.
    fn in_backward_incompatibility(&self) -> Option<String> {
        let why = if self.accumulation > 1 {
            "needs each step's gradient from one backward: use --accumulation 1 (a larger \
             micro-batch, or checkpointing to make room for one)"
        } else if self.precision.loss_scaling() {
            "cannot run with fp16's loss scaler, which skips a step when any gradient overflows \
             and knows it only after every block has been updated: use --precision bf16-mixed"
        } else if self.placement.moves_model_states() {
            "runs each block's update on the device of a single process (torchtune's \
             optimizer_in_bwd): it does not combine with ZeRO sharding or offload"
        } else {
            return None;
        };
        Some(format!("--optimizer-in-backward {why}"))
    }

    /// How far the numerics depart from mixed-precision AdamW: 0 for the reference semantics
    /// (fp32 or mixed precision with AdamW), +1 for pure bf16, +1 for memory-saving Adam
    /// variants, +2 for another optimizer family, +1 for the step in backward (no global-norm
    /// clipping). Plans rank by tier first.
    pub fn fidelity_tier(&self) -> u8 {
        u8::from(self.precision == Precision::Bf16)
            + self.optimizer.fidelity_tier()
            + u8::from(self.optimizer_in_backward)
    }

    /// `fp32, adamw, checkpoint none, naive attention, micro-batch 16 × 1` (without the
    /// attention for a model that has none; with the placement when it is not local, the loss
    /// when it is chunked and the step when it runs in backward).
    pub fn describe(&self, has_attention: bool) -> String {
        let attention = if has_attention {
            format!(", {} attention", self.attention)
        } else {
            String::new()
        };
        let activations = match self.placement.offload_activations {
            Offload::None => "",
            _ => ", activations offloaded to cpu",
        };
        let placement = if self.placement.is_local() {
            String::new()
        } else if !self.placement.moves_model_states() {
            activations.to_string()
        } else {
            format!(
                ", ZeRO-{} (offload optimizer {}, params {}){activations}",
                self.placement.zero_stage,
                self.placement.offload_optimizer,
                self.placement.offload_params
            )
        };
        let loss = match self.loss {
            Loss::Plain => String::new(),
            chunked => format!(", loss {chunked}"),
        };
        let in_backward = match self.optimizer_in_backward {
            true => ", step in backward",
            false => "",
        };
        format!(
            "{}, {}{in_backward}{placement}, checkpoint {}{attention}{loss}, micro-batch {} × {}",
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
             \"offload_optimizer\":\"none\",\"offload_params\":\"none\",\"offload_activations\":\"none\",\"checkpoint\":\"none\",\
             \"attention\":\"naive\",\"loss\":\"plain\",\"optimizer_in_backward\":false,\"micro_batch\":4,\"accumulation\":2}"
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["zero_stage"], 0);
        assert_eq!(json["checkpoint"], "none");
        let back: Strategy = serde_json::from_value(json).unwrap();
        assert_eq!(back, strategy());
    }

    #[test]
    fn the_step_in_backward_refuses_what_needs_every_gradient_first() {
        let fused = Strategy {
            optimizer_in_backward: true,
            accumulation: 1,
            ..strategy()
        };
        assert_eq!(fused.incompatibility(), None);
        let refused = |s: Strategy, why: &str| {
            let e = s.incompatibility().unwrap();
            assert!(
                e.contains("--optimizer-in-backward") && e.contains(why),
                "{e}"
            );
        };
        refused(
            Strategy {
                accumulation: 2,
                ..fused
            },
            "--accumulation 1",
        );
        refused(
            Strategy {
                precision: Precision::Fp16Mixed,
                ..fused
            },
            "loss scaler",
        );
        // Offload needs a ZeRO stage, so every non-local placement has one.
        for stage in 1..=3 {
            let placement = Placement {
                zero_stage: ZeroStage::new(stage).unwrap(),
                ..Placement::default()
            };
            refused(Strategy { placement, ..fused }, "ZeRO sharding or offload");
        }
        assert!(fused.describe(true).contains("adamw, step in backward"));
    }

    #[test]
    fn every_optimizer_runs_and_every_zero_stage_with_adam_and_lamb() {
        for &optimizer in Optimizer::ALL {
            let s = Strategy {
                optimizer,
                ..strategy()
            };
            assert_eq!(s.incompatibility(), None, "{optimizer}");
        }
        let s = Strategy {
            placement: Placement {
                zero_stage: ZeroStage::new(2).unwrap(),
                ..Placement::default()
            },
            ..strategy()
        };
        // Every ZeRO stage runs in the engine.
        assert_eq!(s.incompatibility(), None);
        let zero1 = Strategy {
            placement: Placement {
                zero_stage: ZeroStage::new(1).unwrap(),
                ..Placement::default()
            },
            ..strategy()
        };
        assert_eq!(zero1.incompatibility(), None);
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
            assert_eq!(lamb.incompatibility(), None, "ZeRO-{stage}");
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
