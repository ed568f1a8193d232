//! `Pins`: the levers a user fixed (a flag, a key of the config file); `None` means "choose".
//! The search keeps every pinned lever and, among near-equal plans, prefers the one that
//! changes the fewest levers of the configured strategy.
//!
//! Not for: the search itself (the planner's `search`).

use crate::{Attention, Checkpoint, Loss, Offload, Optimizer, Precision, Strategy, ZeroStage};

/// Levers fixed by the user; `None` means "search".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pins {
    pub precision: Option<Precision>,
    pub optimizer: Option<Optimizer>,
    pub zero_stage: Option<ZeroStage>,
    pub offload_optimizer: Option<Offload>,
    pub offload_params: Option<Offload>,
    pub offload_activations: Option<Offload>,
    pub checkpoint: Option<Checkpoint>,
    pub attention: Option<Attention>,
    pub loss: Option<Loss>,
    pub optimizer_in_backward: Option<bool>,
    pub micro_batch: Option<u64>,
    pub accumulation: Option<u64>,
    /// The device allocator of headroom's engine (not a field of a strategy: it changes what a
    /// plan reserves, not what it computes).
    pub allocator: Option<headroom_memory::AllocatorKind>,
}

impl Pins {
    /// Whether any lever is pinned.
    pub fn any(&self) -> bool {
        *self != Pins::default()
    }

    /// Whether `s` keeps every pinned lever.
    pub fn allow(&self, s: &Strategy) -> bool {
        fn keeps<T: PartialEq>(pin: Option<T>, v: T) -> bool {
            pin.is_none_or(|p| p == v)
        }
        keeps(self.precision, s.precision)
            && keeps(self.optimizer, s.optimizer)
            && keeps(self.zero_stage, s.placement.zero_stage)
            && keeps(self.offload_optimizer, s.placement.offload_optimizer)
            && keeps(self.offload_params, s.placement.offload_params)
            && keeps(self.offload_activations, s.placement.offload_activations)
            && keeps(self.checkpoint, s.checkpoint)
            && keeps(self.attention, s.attention)
            && keeps(self.loss, s.loss)
            && keeps(self.optimizer_in_backward, s.optimizer_in_backward)
            && keeps(self.micro_batch, s.micro_batch)
            && keeps(self.accumulation, s.accumulation)
    }

    /// The strategy a run configures with these pins: `base` (the defaults of the run, e.g.
    /// `Strategy::default()` for a plain PyTorch or Hugging Face script) with every pinned lever
    /// set. The search prefers it among near-equal plans.
    pub fn configure(&self, base: Strategy) -> Strategy {
        let placement = crate::Placement {
            zero_stage: self.zero_stage.unwrap_or(base.placement.zero_stage),
            offload_optimizer: self
                .offload_optimizer
                .unwrap_or(base.placement.offload_optimizer),
            offload_params: self.offload_params.unwrap_or(base.placement.offload_params),
            offload_activations: self
                .offload_activations
                .unwrap_or(base.placement.offload_activations),
        };
        Strategy {
            precision: self.precision.unwrap_or(base.precision),
            optimizer: self.optimizer.unwrap_or(base.optimizer),
            placement,
            checkpoint: self.checkpoint.unwrap_or(base.checkpoint),
            attention: self.attention.unwrap_or(base.attention),
            loss: self.loss.unwrap_or(base.loss),
            optimizer_in_backward: self
                .optimizer_in_backward
                .unwrap_or(base.optimizer_in_backward),
            micro_batch: self.micro_batch.unwrap_or(base.micro_batch),
            accumulation: self.accumulation.unwrap_or(base.accumulation),
        }
    }
}

/// Levers in which `s` differs from `configured` (the accumulation follows the micro-batch for a
/// fixed effective batch and is not counted).
pub fn changed_levers(s: &Strategy, configured: &Strategy) -> usize {
    usize::from(s.precision != configured.precision)
        + usize::from(s.optimizer != configured.optimizer)
        + usize::from(s.placement != configured.placement)
        + usize::from(s.checkpoint != configured.checkpoint)
        + usize::from(s.attention != configured.attention)
        + usize::from(s.loss != configured.loss)
        + usize::from(s.optimizer_in_backward != configured.optimizer_in_backward)
        + usize::from(s.micro_batch != configured.micro_batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_allow_only_strategies_that_keep_them() {
        let pins = Pins {
            precision: Some(Precision::Bf16Mixed),
            micro_batch: Some(4),
            ..Pins::default()
        };
        let s = Strategy {
            precision: Precision::Bf16Mixed,
            micro_batch: 4,
            accumulation: 8,
            ..Strategy::default()
        };
        assert!(pins.any() && pins.allow(&s));
        assert!(!pins.allow(&Strategy {
            micro_batch: 2,
            ..s
        }));
        assert!(!Pins::default().any() && Pins::default().allow(&s));
        let configured = Strategy {
            micro_batch: 2,
            accumulation: 16,
            ..s
        };
        assert_eq!(changed_levers(&s, &configured), 1);
    }
}
