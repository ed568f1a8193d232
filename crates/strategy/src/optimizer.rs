//! Optimizers: every one the planner models and the engine runs, each knowing the format of its
//! states and how far its numerics depart from AdamW.
//!
//! Not for: the update rules themselves (the nn crate) or the bytes of quantised and factored
//! states, which depend on the model's shapes (the planner's cost model).

use crate::named::named_enum;
use crate::precision::{NumberFormat, Precision};

named_enum!(
    #[derive(Default)]
    /// The optimizer, which fixes the optimizer-state bytes per parameter.
    Optimizer, "--optimizer", {
        /// Plain SGD: no state.
        Sgd = "sgd",
        /// SGD with momentum 0.9: one state.
        SgdMomentum = "sgd-momentum",
        /// AdamW with states in the format of the weights it updates.
        #[default]
        AdamW = "adamw",
        /// AdamW with bf16 momentum and variance.
        AdamWBf16 = "adamw-bf16",
        /// 8-bit AdamW (Dettmers et al. 2022): uint8 states + an fp32 absmax per 2048.
        AdamW8bit = "adamw-8bit",
        /// 8-bit AdamW with paged states (bitsandbytes' PagedAdamW8bit): the states live in host
        /// memory and are paged onto the device one block at a time for its update.
        PagedAdamW8bit = "paged-adamw-8bit",
        /// Adafactor without momentum (Shazeer & Stern 2018): factored second moment.
        Adafactor = "adafactor",
        /// LAMB (You et al. 2020): Adam's states with a per-tensor trust ratio.
        Lamb = "lamb",
    }
);

impl Optimizer {
    /// Full-size state tensors per parameter; `None` for quantised or factored states, whose
    /// size depends on block size or tensor shapes.
    pub const fn states_per_param(self) -> Option<u64> {
        match self {
            Optimizer::Sgd => Some(0),
            Optimizer::SgdMomentum => Some(1),
            Optimizer::AdamW | Optimizer::AdamWBf16 | Optimizer::Lamb => Some(2),
            Optimizer::AdamW8bit | Optimizer::PagedAdamW8bit | Optimizer::Adafactor => None,
        }
    }

    /// Format of full-size states under `precision` (bf16 for `adamw-bf16`, else the format of
    /// the weights the optimizer updates).
    pub const fn state_format(self, precision: Precision) -> NumberFormat {
        match self {
            Optimizer::AdamWBf16 => NumberFormat::Bf16,
            _ => precision.state_format(),
        }
    }

    /// Default peak learning rate of the engine (after warm-up). Adafactor's 2e-3 is the best
    /// of 1e-3, 2e-3, 3e-3, 6e-3 and 1e-2 on the default model (docs/benchmarks.md).
    pub const fn default_lr(self) -> f32 {
        match self {
            Optimizer::Sgd | Optimizer::SgdMomentum => 0.1,
            Optimizer::Lamb => 1e-2,
            Optimizer::Adafactor => 2e-3,
            _ => 3e-3,
        }
    }

    /// Whether the states live off the device between updates (paged).
    pub const fn paged(self) -> bool {
        matches!(self, Optimizer::PagedAdamW8bit)
    }

    /// 0: AdamW semantics; 1: memory-saving variants of Adam (bf16, 8-bit, paged 8-bit,
    /// factored states); 2: a different optimizer family.
    pub const fn fidelity_tier(self) -> u8 {
        match self {
            Optimizer::AdamW => 0,
            Optimizer::AdamWBf16
            | Optimizer::AdamW8bit
            | Optimizer::PagedAdamW8bit
            | Optimizer::Adafactor => 1,
            Optimizer::Sgd | Optimizer::SgdMomentum | Optimizer::Lamb => 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adam_keeps_two_states_in_the_updated_weights_format() {
        assert_eq!(Optimizer::AdamW.states_per_param(), Some(2));
        assert_eq!(
            Optimizer::AdamW.state_format(Precision::Bf16Mixed),
            NumberFormat::F32
        );
        assert_eq!(
            Optimizer::AdamW.state_format(Precision::Bf16),
            NumberFormat::Bf16
        );
        assert_eq!(
            Optimizer::AdamWBf16.state_format(Precision::Fp32),
            NumberFormat::Bf16
        );
    }
}

named_enum!(
    #[derive(Default)]
    /// How a framework's cross-entropy holds the vocabulary-sized tensors, and whose modules
    /// the model runs: Hugging Face's causal-LM loss (`ForCausalLMLoss`) upcasts the
    /// compute-dtype logits the model returns (released with the model's output before
    /// backward), then PyTorch's `F.cross_entropy` saves fp32 log-probabilities and allocates
    /// two fp32 gradients in backward, on transformers' modules; a training loop with its own
    /// modules that computes fp32 logits and releases them before backward (torchtune,
    /// torchtitan) runs the same `F.cross_entropy`; Megatron-LM's
    /// `vocab_parallel_cross_entropy` writes the gradient into the softmax it saved in forward
    /// (`grad_input = softmax`, then in-place updates), so the fp32 logits exist once; a
    /// forward/backward benchmark that calls `logits.sum().backward()` on the model's output
    /// runs no cross-entropy at all (its logits stay in the compute dtype, held by the output
    /// the loop keeps).
    LossImpl, "--loss-impl", {
        /// Hugging Face's causal-LM loss on the model's compute-dtype logits.
        #[default]
        HuggingFace = "hugging-face",
        /// `F.cross_entropy` on fp32 logits released before backward, the loop's own modules.
        Separate = "separate",
        /// The gradient written into the saved softmax.
        InPlace = "in-place",
        /// `logits.sum()` on the model's compute-dtype logits, no cross-entropy (benchmarks).
        Sum = "sum",
    }
);

named_enum!(
    #[derive(Default)]
    /// What the loop's `zero_grad()` does to the gradients between steps (PyTorch's
    /// `set_to_none` of `Optimizer.zero_grad` and `Module.zero_grad`): since PyTorch 2.0 it sets
    /// them to `None` by default, so with one micro-batch a step no gradient exists when the
    /// next backward starts and each is made as backward reaches it; before 2.0 (and with
    /// `set_to_none=False`) it fills them with zeros in place, so every gradient is held through
    /// the whole step (PyTorch 2.0 release notes, "torch.nn.Module.zero_grad and
    /// Optimizer.zero_grad now default set_to_none=True").
    ZeroGrad, "--zero-grad", {
        /// `set_to_none=True`: the gradients freed between steps (PyTorch 2.0 and later).
        #[default]
        SetToNone = "set-to-none",
        /// `set_to_none=False`: the gradients zero-filled in place, held between steps.
        ZeroFill = "zero-fill",
    }
);

named_enum!(
    #[derive(Default)]
    /// How a framework's optimizer walks the parameters, which decides the step's temporaries:
    /// PyTorch's `foreach` kernels (its default on CUDA since 2.0) hold intermediates for every
    /// tensor at once, about one copy of the parameters being updated (torchtune PR #389);
    /// `fused=True` and a per-tensor loop (Hugging Face's `adamw_hf`, `foreach=False`) hold at
    /// most one tensor's.
    OptimizerImpl, "--optimizer-impl", {
        /// Multi-tensor `foreach` kernels: a copy of the updated parameters at once.
        #[default]
        Foreach = "foreach",
        /// One fused kernel per parameter group: no full-size intermediate.
        Fused = "fused",
        /// One tensor at a time: that tensor's intermediates.
        PerTensor = "per-tensor",
    }
);
