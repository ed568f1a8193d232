//! Element types of tensor storage: f32, bf16 and f16 floats (the `half` crate) and i32/i64
//! indices, plus `Elem`, the trait the CPU kernels use to load any float type into f32
//! registers and store it back. All float math is done in f32.
//!
//! Not for: casting policy (see `autocast`).

use half::{bf16, f16};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
    I32,
    I64,
}

impl DType {
    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::I64 => 8,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A float storage type that kernels widen to f32 for arithmetic.
pub trait Elem: bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

/// bf16 conversions written without branches, so the element loops that call them vectorise
/// (the `half` crate's own return early for NaN, which keeps LLVM from vectorising the loop).
/// Bit for bit the same as `half`'s: round to nearest even, NaN kept quiet with its high
/// mantissa bits (tested against `half` over every bf16 and a sweep of f32 bit patterns).
impl Elem for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        let b = self.to_bits() as u32;
        let quiet = if b & 0x7FFF > 0x7F80 { 0x0040 } else { 0 };
        f32::from_bits((b | quiet) << 16)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        let x = v.to_bits();
        // Adding 0x7FFF plus the kept part's lowest bit carries into it exactly when the
        // dropped half is above one half, or at one half with an odd kept part.
        let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
        let nan = (x >> 16) | 0x0040;
        bf16::from_bits(if x & 0x7FFF_FFFF > 0x7F80_0000 {
            nan
        } else {
            rounded
        } as u16)
    }
}

/// f16 conversions written without branches, for the same reason as bf16's: `half` checks
/// for F16C at run time on every element and converts one value at a time, which keeps the
/// element loops scalar. Bit for bit the same as `half`'s (round to nearest even, subnormals
/// kept, NaN quieted with its payload; tested over every f16 and a sweep of f32 patterns).
impl Elem for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        let h = self.to_bits() as u32;
        let sign = (h & 0x8000) << 16;
        let em = h & 0x7FFF;
        // Normal: move the fields up and rebias the exponent by 127 − 15.
        let normal = (em << 13) + (112 << 23);
        // Subnormal (and zero): mantissa · 2⁻²⁴, exact in f32.
        let subnormal = (em as f32 * f32::from_bits(0x3380_0000)).to_bits();
        let quiet = if em & 0x03FF != 0 { 0x0040_0000 } else { 0 };
        let inf_nan = (em << 13) | 0x7F80_0000 | quiet;
        let bits = if em >= 0x7C00 {
            inf_nan
        } else if em < 0x0400 {
            subnormal
        } else {
            normal
        };
        f32::from_bits(sign | bits)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        let x = v.to_bits();
        let sign = (x >> 16) & 0x8000;
        let a = x & 0x7FFF_FFFF;
        let nan = 0x7E00 | ((a & 0x007F_FFFF) >> 13);
        // Normal: rebias, then round the 13 dropped bits to nearest even (a carry may reach the
        // exponent, and at 65,520 and above, infinity).
        let b = a.wrapping_sub(112 << 23);
        // Every branch is computed (so the loop has no jumps): the ones not taken may wrap.
        let normal = b.wrapping_add(0x0FFF + ((b >> 13) & 1)) >> 13;
        // Below 2⁻¹⁴: adding 0.5 makes the f32 adder round to a multiple of 2⁻²⁴ (nearest even),
        // leaving the f16 mantissa in the low bits.
        let subnormal = (f32::from_bits(a) + 0.5)
            .to_bits()
            .wrapping_sub(0x3F00_0000);
        let bits = if a > 0x7F80_0000 {
            nan
        } else if a >= 0x4780_0000 {
            0x7C00
        } else if a < 0x3880_0000 {
            subnormal
        } else {
            normal
        };
        f16::from_bits((bits | sign) as u16)
    }
}

/// Runs `$body` with `$T` bound to the Rust type of a float dtype; other dtypes evaluate `$other`.
macro_rules! with_float_type {
    ($dtype:expr, $T:ident => $body:expr, _ => $other:expr) => {
        match $dtype {
            $crate::dtype::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::dtype::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::dtype::DType::F16 => {
                type $T = half::f16;
                $body
            }
            _ => $other,
        }
    };
}
pub(crate) use with_float_type;

#[cfg(test)]
mod tests {
    use super::Elem;
    use half::{bf16, f16};

    #[test]
    fn bf16_conversions_match_half_bit_for_bit() {
        // Every bf16 widens as half widens it (NaNs included, compared as bits).
        for bits in 0..=u16::MAX {
            let b = bf16::from_bits(bits);
            assert_eq!(
                Elem::to_f32(b).to_bits(),
                bf16::to_f32(b).to_bits(),
                "{bits:#06x}"
            );
        }
        // f32 bit patterns: every high half with low halves around the rounding point (ties,
        // one either side, zero, all ones), plus a stride through the whole range.
        let lows = [0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000];
        let patterns = (0..=u16::MAX as u32)
            .flat_map(|hi| lows.iter().map(move |lo| hi << 16 | lo))
            .chain((0..u32::MAX).step_by(65_521));
        for x in patterns {
            let v = f32::from_bits(x);
            assert_eq!(
                <bf16 as Elem>::from_f32(v).to_bits(),
                bf16::from_f32(v).to_bits(),
                "{x:#010x}"
            );
        }
    }

    #[test]
    fn f16_conversions_match_half_bit_for_bit() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            assert_eq!(
                Elem::to_f32(h).to_bits(),
                f16::to_f32(h).to_bits(),
                "{bits:#06x}"
            );
        }
        // Around every rounding point of an f16 (13 dropped bits: ties with an even and an odd
        // kept bit, one either side) at every f32 exponent, the subnormal range densely, and a
        // stride through the whole range.
        let lows = [
            0u32, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2FFF, 0x3000, 0x3001, 0xF000,
        ];
        let patterns = (0..=u16::MAX as u32)
            .flat_map(|hi| lows.iter().map(move |lo| hi << 16 | lo))
            .chain((0..=0x1FFFFu32).map(|m| 0x3300_0000 + m * 97))
            .chain((0..u32::MAX).step_by(65_521));
        for x in patterns {
            let v = f32::from_bits(x);
            assert_eq!(
                <f16 as Elem>::from_f32(v).to_bits(),
                f16::from_f32(v).to_bits(),
                "{x:#010x}"
            );
        }
    }
}
