//! Block-wise 8-bit quantization of optimizer states (Dettmers, Lewis, Shleifer, Zettlemoyer,
//! "8-bit Optimizers via Block-wise Quantization", ICLR 2022, arXiv:2110.02861; the layout of
//! bitsandbytes since v0.44: blocks of 256, docs/sources.md §16). A state is stored as one byte
//! per element, an index into a 256-entry dynamic code, and one f32 absolute maximum per block;
//! an element's value is `code[q] × absmax`. The dynamic code (bitsandbytes'
//! `create_dynamic_map`) spends its indices on seven decades, 10⁻⁶ to 1, each split linearly, so
//! small and large magnitudes keep about the same relative precision: a signed code for the
//! first moment, an unsigned one (twice the resolution) for the second.
//!
//! Not for: the update rule (`adamw8bit`).

use std::sync::OnceLock;

/// Elements sharing one absmax.
pub const BLOCK: usize = 256;

/// A sorted 256-entry code over [−1, 1] (signed) or [0, 1] (unsigned).
pub struct DynamicCode {
    pub values: [f32; 256],
    /// The index of 0.0.
    pub zero: u8,
    /// For each value's upper 16 bits (its bf16 truncation), the index of the code nearest the
    /// truncated value: the nearest code of any value with those bits is within two of it, since
    /// a bf16 step (at most 2⁻⁷ relative) crosses at most two midpoints between codes.
    guess: Vec<u8>,
}

impl std::fmt::Debug for DynamicCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamicCode")
            .field("zero", &self.zero)
            .finish()
    }
}

impl DynamicCode {
    fn new(signed: bool) -> DynamicCode {
        // Seven decades; decade i holds 2^i (signed, each sign) or 2^(i+1) (unsigned) midpoints
        // of a linear split of [0.1, 1], scaled by 10^(i−6). With 0 and 1: 256 values.
        let mut v: Vec<f64> = Vec::with_capacity(256);
        for i in 0..7i32 {
            let items = if signed {
                (1 << i) + 1
            } else {
                (1 << (i + 1)) + 1
            };
            let scale = 10f64.powi(i - 6);
            let bound = |k: i32| 0.1 + 0.9 * k as f64 / (items - 1) as f64;
            for k in 0..items - 1 {
                let mid = (bound(k) + bound(k + 1)) / 2.0;
                v.push(scale * mid);
                if signed {
                    v.push(-scale * mid);
                }
            }
        }
        v.push(0.0);
        v.push(1.0);
        assert_eq!(v.len(), 256, "the dynamic code has 256 values");
        v.sort_by(f64::total_cmp);
        let mut values = [0f32; 256];
        for (o, x) in values.iter_mut().zip(&v) {
            *o = *x as f32;
        }
        let zero = values.iter().position(|&x| x == 0.0).expect("0 is a code") as u8;
        let guess = (0..=u16::MAX)
            .map(|k| {
                let t = f32::from_bits(u32::from(k) << 16);
                if t.is_finite() {
                    nearest_by_search(&values, t)
                } else {
                    zero
                }
            })
            .collect();
        DynamicCode {
            values,
            zero,
            guess,
        }
    }

    /// The signed code (first moments).
    pub fn signed() -> &'static DynamicCode {
        static CODE: OnceLock<DynamicCode> = OnceLock::new();
        CODE.get_or_init(|| DynamicCode::new(true))
    }

    /// The unsigned code (second moments).
    pub fn unsigned() -> &'static DynamicCode {
        static CODE: OnceLock<DynamicCode> = OnceLock::new();
        CODE.get_or_init(|| DynamicCode::new(false))
    }

    /// The index of the code value nearest `x` (ties to the lower index), for `x` in the
    /// code's range.
    #[inline]
    pub fn nearest(&self, x: f32) -> u8 {
        let g = self.guess[(x.to_bits() >> 16) as usize] as usize;
        let (lo, hi) = (g.saturating_sub(2), (g + 2).min(255));
        let mut best = lo;
        for i in lo + 1..=hi {
            if (x - self.values[i]).abs() < (x - self.values[best]).abs() {
                best = i;
            }
        }
        best as u8
    }

    /// Dequantizes a block: `out[i] = code[codes[i]] × absmax`.
    #[inline]
    pub fn dequantize(&self, codes: &[u8], absmax: f32, out: &mut [f32]) {
        for (o, &q) in out.iter_mut().zip(codes) {
            *o = self.values[q as usize] * absmax;
        }
    }

    /// Quantizes a block: returns its absmax and writes each element's nearest code of
    /// `value / absmax` (all zero codes when the block is zero).
    #[inline]
    pub fn quantize(&self, values: &[f32], codes: &mut [u8]) -> f32 {
        let absmax = values.iter().fold(0f32, |m, x| m.max(x.abs()));
        if absmax == 0.0 || !absmax.is_finite() {
            codes.fill(self.zero);
            return if absmax.is_finite() { 0.0 } else { absmax };
        }
        let inv = 1.0 / absmax;
        for (q, &x) in codes.iter_mut().zip(values) {
            *q = self.nearest(x * inv);
        }
        absmax
    }
}

/// The nearest code by binary search (ties to the lower index).
fn nearest_by_search(values: &[f32; 256], x: f32) -> u8 {
    let hi = values.partition_point(|&c| c < x).min(255);
    if hi == 0 {
        return 0;
    }
    let lo = hi - 1;
    if (x - values[lo]).abs() <= (values[hi] - x).abs() {
        lo as u8
    } else {
        hi as u8
    }
}

/// Blocks of a state of `len` elements.
pub fn blocks(len: usize) -> usize {
    len.div_ceil(BLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_span_seven_decades_with_zero_and_one() {
        let (s, u) = (DynamicCode::signed(), DynamicCode::unsigned());
        for c in [s, u] {
            assert!(
                c.values.windows(2).all(|w| w[0] < w[1]),
                "sorted and distinct"
            );
            assert_eq!(c.values[255], 1.0);
            assert_eq!(c.values[c.zero as usize], 0.0);
        }
        // Signed: 127 negative values, zero, 128 positive (1 included); unsigned: 255 above zero.
        assert_eq!(s.values.iter().filter(|&&x| x < 0.0).count(), 127);
        assert_eq!(s.zero, 127);
        assert_eq!((u.zero, u.values[0]), (0, 0.0));
        // The smallest magnitudes, by hand: the first decade splits [0.1, 1] into 1 part
        // (signed: midpoint 0.55) or 2 (unsigned: midpoints 0.325 and 0.775), times 10⁻⁶.
        assert!((s.values[128] - 0.55e-6).abs() < 1e-12, "{}", s.values[128]);
        assert!((u.values[1] - 0.325e-6).abs() < 1e-12, "{}", u.values[1]);
        assert_eq!(s.values[0], -s.values[254]);
    }

    #[test]
    fn the_fast_lookup_finds_the_nearest_code_everywhere() {
        for c in [DynamicCode::signed(), DynamicCode::unsigned()] {
            let lo = c.values[0];
            // Every code, every midpoint and a dense sweep of the range, with neighbours.
            let mut xs: Vec<f32> = c.values.to_vec();
            xs.extend(c.values.windows(2).map(|w| (w[0] + w[1]) / 2.0));
            xs.extend((0..200_000).map(|i| lo + (1.0 - lo) * i as f32 / 200_000.0));
            // Log-spaced magnitudes from 10⁻⁸ to 1, both signs.
            let logs = (0..2_000).map(|i| 10f32.powf(-8.0 + i as f32 * 4e-3));
            xs.extend(logs.flat_map(|x| [x, -x]));
            for x in xs {
                for x in [
                    x,
                    f32::from_bits(x.to_bits() + 1),
                    f32::from_bits(x.to_bits().saturating_sub(1)),
                ] {
                    if !(lo..=1.0).contains(&x) {
                        continue;
                    }
                    let (a, b) = (
                        c.nearest(x) as usize,
                        nearest_by_search(&c.values, x) as usize,
                    );
                    // Equal, or equally near (a tie the search broke the other way).
                    assert!(
                        a == b || (x - c.values[a]).abs() == (x - c.values[b]).abs(),
                        "{x}: {a} against {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_block_round_trips_within_half_a_code_step() {
        let c = DynamicCode::signed();
        let values: Vec<f32> = (0..BLOCK)
            .map(|i| ((i as f32 * 0.37).sin()) * 1e-3)
            .collect();
        let mut codes = [0u8; BLOCK];
        let absmax = c.quantize(&values, &mut codes);
        let mut back = [0f32; BLOCK];
        c.dequantize(&codes, absmax, &mut back);
        for (&x, &y) in values.iter().zip(&back) {
            // The error is at most half the gap between the two codes around x / absmax; below
            // the most negative code (−0.99297…: the signed code has no −1) it is the distance
            // to that code.
            let n = x / absmax;
            let hi = c.values.partition_point(|&v| v < n).min(255);
            let bound = match hi {
                0 => c.values[0] - n,
                _ => 0.5 * (c.values[hi] - c.values[hi - 1]),
            };
            // (plus f32 rounding of x / absmax and of the product, far below a code step)
            assert!((x - y).abs() <= (bound + 1e-6) * absmax, "{x} → {y}");
        }
        // A largest element that is positive is exact: it is 1 × absmax.
        let i = values
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        if values[i] == absmax {
            assert_eq!(back[i], absmax);
        }
        // A zero block stays zero.
        let absmax = c.quantize(&[0.0; 8], &mut codes[..8]);
        c.dequantize(&codes[..8], absmax, &mut back[..8]);
        assert!(back[..8].iter().all(|&x| x == 0.0) && absmax == 0.0);
    }
}
