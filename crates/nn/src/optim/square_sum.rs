//! An exact sum of squares of f32 values, for LAMB's per-tensor norms. An f32 is an integer
//! times 2^-149, so its square is an integer times 2^-298 below 2^554; the sum is kept as that
//! integer (640 bits: room for 2^86 terms), so a tensor cut anywhere into pieces whose sums are
//! added in any order has the bits of the whole tensor's sum — which lets ZeRO's shards add up
//! a tensor's norm to exactly the unsharded value. Infinite and NaN terms are kept aside as
//! flags, as an f64 sum would propagate them.
//!
//! Over an f32 communicator a sum travels as digits small enough that the sum over every rank
//! of one digit is an exact f32 integer ([`SquareSum::to_digits`], [`SquareSum::from_digits`]).
//!
//! Not for: the update rule (see `lamb`).

/// 64-bit limbs of the fixed-point integer (unit 2^-298).
const LIMBS: usize = 10;
/// Exponent of the integer's unit.
const UNIT_EXP: i32 = -298;
const INF: u8 = 1;
const NAN: u8 = 2;

/// Σ x² over f32 values x, exactly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SquareSum {
    limbs: [u64; LIMBS],
    /// `INF` and `NAN` terms seen.
    non_finite: u8,
}

impl SquareSum {
    /// Adds x².
    #[inline]
    pub fn add_square(&mut self, x: f32) {
        let bits = x.to_bits();
        let exponent = (bits >> 23) & 0xff;
        let fraction = (bits & 0x7f_ffff) as u64;
        // x = M·2^(E−150) (normal) or f·2^−149 (subnormal): x² = M²·2^(2E−2) units.
        let (m, shift) = match exponent {
            0xff => {
                self.non_finite |= if fraction == 0 { INF } else { NAN };
                return;
            }
            0 => (fraction, 0),
            e => (fraction | 1 << 23, 2 * e as usize - 2),
        };
        if m != 0 {
            self.add_at(m * m, shift);
        }
    }

    /// Adds another sum (a neighbouring piece of the same tensor).
    pub fn add(&mut self, other: &SquareSum) {
        let mut carry = 0u128;
        for (a, &b) in self.limbs.iter_mut().zip(&other.limbs) {
            let s = *a as u128 + b as u128 + carry;
            *a = s as u64;
            carry = s >> 64;
        }
        assert_eq!(carry, 0, "a sum of more than 2^86 squares");
        self.non_finite |= other.non_finite;
    }

    /// Adds `x`·2^`shift` units, carrying.
    fn add_at(&mut self, x: u64, shift: usize) {
        let mut pending = (x as u128) << (shift % 64);
        let mut j = shift / 64;
        while pending != 0 {
            assert!(j < LIMBS, "a sum of more than 2^86 squares");
            let s = self.limbs[j] as u128 + (pending as u64) as u128;
            self.limbs[j] = s as u64;
            pending = (pending >> 64) + (s >> 64);
            j += 1;
        }
    }

    /// The sum as f64 (NaN after a NaN term, else infinite after an infinite one): the limbs
    /// added from the most significant down, a function of the exact sum alone.
    pub fn value(&self) -> f64 {
        if self.non_finite & NAN != 0 {
            return f64::NAN;
        }
        if self.non_finite & INF != 0 {
            return f64::INFINITY;
        }
        self.limbs
            .iter()
            .enumerate()
            .rev()
            .fold(0.0f64, |acc, (i, &limb)| {
                acc + limb as f64 * pow2(64 * i as i32 + UNIT_EXP)
            })
    }

    /// Bits per digit on a group of `world` ranks: `world` digits add up below 2^24.
    fn digit_bits(world: usize) -> usize {
        let rank_bits = (usize::BITS - world.max(1).saturating_sub(1).leading_zeros()) as usize;
        assert!(rank_bits < 24, "more than 2^23 ranks");
        (24 - rank_bits).min(16)
    }

    /// f32 values one sum takes on a group of `world` ranks: its digits and the non-finite flag
    /// (82 for a pair of sums at up to 256 ranks: 2 × (640 / 16 + 1)).
    pub fn digits(world: usize) -> usize {
        (64 * LIMBS).div_ceil(Self::digit_bits(world)) + 1
    }

    /// Writes the sum as [`SquareSum::digits`] f32 values into `out`: least significant digit
    /// first, then 0, ∞ or NaN (whose f32 sum over ranks is the flag of the whole).
    pub fn to_digits(&self, world: usize, out: &mut [f32]) {
        let bits = Self::digit_bits(world);
        let (flag, digits) = out.split_last_mut().expect("room for the digits");
        for (k, d) in digits.iter_mut().enumerate() {
            *d = self.bits_at(k * bits, bits) as f32;
        }
        *flag = match self.non_finite {
            0 => 0.0,
            f if f & NAN != 0 => f32::NAN,
            _ => f32::INFINITY,
        };
    }

    /// The sum whose digits (each summed over at most `world` ranks) are `digits`.
    pub fn from_digits(world: usize, digits: &[f32]) -> SquareSum {
        let bits = Self::digit_bits(world);
        let (&flag, digits) = digits.split_last().expect("the digits and the flag");
        let mut sum = SquareSum::default();
        for (k, &d) in digits.iter().enumerate() {
            debug_assert!(d >= 0.0 && d.fract() == 0.0 && d < 16_777_216.0, "{d}");
            sum.add_at(d as u64, k * bits);
        }
        sum.non_finite = if flag.is_nan() {
            NAN
        } else if flag.is_infinite() {
            INF
        } else {
            0
        };
        sum
    }

    /// `len` (≤ 16) bits of the integer from bit `at`.
    fn bits_at(&self, at: usize, len: usize) -> u64 {
        let (i, shift) = (at / 64, at % 64);
        let mut v = self.limbs[i] >> shift;
        if shift + len > 64 && i + 1 < LIMBS {
            v |= self.limbs[i + 1] << (64 - shift);
        }
        v & ((1 << len) - 1)
    }
}

/// 2^e for a normal f64 exponent.
fn pow2(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum_of(xs: &[f32]) -> SquareSum {
        let mut s = SquareSum::default();
        xs.iter().for_each(|&x| s.add_square(x));
        s
    }

    #[test]
    fn small_sums_are_the_exact_values() {
        // 3² + 4² = 25; 0.5² + 0.25² = 0.3125; the smallest subnormal squared is 2^-298;
        // f32::MAX² = (2^128 − 2^104)² is exact in f64.
        assert_eq!(sum_of(&[3.0, -4.0]).value(), 25.0);
        assert_eq!(sum_of(&[0.5, 0.25]).value(), 0.3125);
        assert_eq!(sum_of(&[f32::from_bits(1)]).value(), pow2(-298));
        let max = f32::MAX as f64;
        assert_eq!(sum_of(&[f32::MAX]).value(), max * max);
        assert_eq!(sum_of(&[]).value(), 0.0);
        assert!(sum_of(&[1.0, f32::INFINITY]).value().is_infinite());
        assert!(sum_of(&[f32::INFINITY, f32::NAN]).value().is_nan());
    }

    #[test]
    fn any_split_gives_the_same_bits() {
        // Magnitudes over 40 binades: an f64 running sum depends on where it is cut.
        let xs: Vec<f32> = (0..1000)
            .map(|i| ((i as f32) * 0.731).sin() * 2f32.powi(i % 41 - 20))
            .collect();
        let whole = sum_of(&xs);
        for cut in [1, 17, 500, 999] {
            let mut left = sum_of(&xs[..cut]);
            let right = sum_of(&xs[cut..]);
            let mut reversed = right;
            reversed.add(&left);
            left.add(&right);
            assert_eq!(left, whole, "cut at {cut}");
            assert_eq!(reversed, whole, "cut at {cut}");
        }
        let f64_sum = |xs: &[f32]| xs.iter().fold(0.0f64, |s, &x| s + x as f64 * x as f64);
        let running = f64_sum(&xs);
        assert!((whole.value() - running).abs() <= 1e-12 * running);
        // What the exact sum avoids: an f64 sum split in two is not the running sum's bits.
        let split = (1..xs.len()).filter(|&c| f64_sum(&xs[..c]) + f64_sum(&xs[c..]) != running);
        assert!(split.count() > 0);
    }

    #[test]
    fn digits_summed_over_ranks_are_the_sum() {
        let xs: Vec<f32> = (0..300).map(|i| (i as f32 * 1.37).cos() * 1e6).collect();
        for world in [2, 3, 256, 257, 5000] {
            let n = SquareSum::digits(world);
            let mut total = vec![0.0f32; n];
            let pieces: Vec<&[f32]> = xs.chunks(300usize.div_ceil(world.min(300))).collect();
            for piece in &pieces {
                let mut d = vec![0.0f32; n];
                sum_of(piece).to_digits(world, &mut d);
                total.iter_mut().zip(&d).for_each(|(t, d)| *t += d);
            }
            assert_eq!(
                SquareSum::from_digits(world, &total),
                sum_of(&xs),
                "{world}"
            );
        }
        assert_eq!(SquareSum::digits(256), 41);
        let mut d = vec![0.0f32; SquareSum::digits(2)];
        sum_of(&[f32::NAN]).to_digits(2, &mut d);
        assert!(SquareSum::from_digits(2, &d).value().is_nan());
    }
}
