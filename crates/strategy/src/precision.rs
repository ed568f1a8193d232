//! Precision modes and what each costs per element: the number format of parameters, gradients
//! and activations, whether fp32 master weights back them, whether the loss is scaled, and the
//! format optimizer states take. This is the one table of bytes per precision; the planner's
//! cost model and the engine both read it.
//!
//! Mixed precision after Micikevicius et al., "Mixed Precision Training" (ICLR 2018): 16-bit
//! weights, activations and gradients, an fp32 master copy the optimizer updates, and (fp16 only)
//! dynamic loss scaling; pure bf16 keeps no master copy and its optimizer states in bf16.
//!
//! Not for: how the engine realises a format (the tensor crate's dtypes and kernels).

use crate::named::named_enum;

/// A floating-point number format of stored values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NumberFormat {
    F32,
    Bf16,
    F16,
}

impl NumberFormat {
    /// Bytes per element.
    pub const fn bytes(self) -> u64 {
        match self {
            NumberFormat::F32 => 4,
            NumberFormat::Bf16 | NumberFormat::F16 => 2,
        }
    }
}

named_enum!(
    #[derive(Default)]
    /// Numeric format of weights, gradients and activations.
    Precision, "--precision", {
        /// fp32 everything (4-byte weights, gradients, activations).
        #[default]
        Fp32 = "fp32",
        /// bf16 weights/gradients/activations with fp32 master weights.
        Bf16Mixed = "bf16-mixed",
        /// fp16 with fp32 master weights and dynamic loss scaling.
        Fp16Mixed = "fp16-mixed",
        /// Pure bf16: no fp32 master copy, optimizer states in bf16.
        Bf16 = "bf16",
    }
);

impl Precision {
    /// Format of parameters, gradients and activations (the compute dtype).
    pub const fn compute(self) -> NumberFormat {
        match self {
            Precision::Fp32 => NumberFormat::F32,
            Precision::Bf16Mixed | Precision::Bf16 => NumberFormat::Bf16,
            Precision::Fp16Mixed => NumberFormat::F16,
        }
    }

    /// Whether fp32 master weights back the 16-bit parameters.
    pub const fn master_weights(self) -> bool {
        matches!(self, Precision::Bf16Mixed | Precision::Fp16Mixed)
    }

    /// Whether the loss is scaled dynamically (fp16's narrow exponent range needs it).
    pub const fn loss_scaling(self) -> bool {
        matches!(self, Precision::Fp16Mixed)
    }

    /// Whether the mode needs a GPU with bf16 arithmetic.
    pub const fn needs_bf16(self) -> bool {
        matches!(self, Precision::Bf16Mixed | Precision::Bf16)
    }

    /// Bytes per parameter element.
    pub const fn param_bytes(self) -> u64 {
        self.compute().bytes()
    }

    /// Bytes per gradient element (gradients take the parameters' format).
    pub const fn grad_bytes(self) -> u64 {
        self.compute().bytes()
    }

    /// Bytes per activation element.
    pub const fn activation_bytes(self) -> u64 {
        self.compute().bytes()
    }

    /// Bytes of fp32 master weight per parameter (0 without a master copy).
    pub const fn master_bytes(self) -> u64 {
        if self.master_weights() { 4 } else { 0 }
    }

    /// Format of optimizer states the optimizer leaves to the precision: the format of the
    /// weights it updates (fp32 masters or fp32 weights; bf16 under pure bf16).
    pub const fn state_format(self) -> NumberFormat {
        match self {
            Precision::Bf16 => NumberFormat::Bf16,
            _ => NumberFormat::F32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_element_follow_the_mixed_precision_recipe() {
        // Mixed precision: 2 B weights and gradients, 4 B master copy (Micikevicius et al.).
        assert_eq!(Precision::Bf16Mixed.param_bytes(), 2);
        assert_eq!(Precision::Fp16Mixed.grad_bytes(), 2);
        assert_eq!(Precision::Bf16Mixed.master_bytes(), 4);
        // fp32 and pure bf16 have no master copy.
        assert_eq!(Precision::Fp32.master_bytes(), 0);
        assert_eq!(Precision::Bf16.master_bytes(), 0);
        assert_eq!(Precision::Fp32.activation_bytes(), 4);
        assert_eq!(Precision::Bf16.state_format(), NumberFormat::Bf16);
        assert!(Precision::Fp16Mixed.loss_scaling() && !Precision::Bf16Mixed.loss_scaling());
    }

    #[test]
    fn names_round_trip_and_bad_names_list_the_accepted() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>().unwrap(), *p);
        }
        let e = "fp8".parse::<Precision>().unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid value 'fp8' for --precision; accepted: fp32, bf16-mixed, fp16-mixed, bf16"
        );
    }
}
