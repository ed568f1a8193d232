//! The plain float types and ggml's original 32-value block formats, decoded to f32.
//!
//! Layouts are ggml's (ggml-org/ggml: `src/ggml-common.h` `block_q4_0` …, decoded as in
//! `src/ggml-quants.c` `dequantize_row_q4_0` …; llama.cpp's `gguf-py/gguf/quants.py` decodes
//! the same blocks with numpy). All multi-byte fields are little-endian; `d` and `m` are IEEE
//! half-precision. Each value is computed with the same f32 operations in the same order as
//! the reference (`d * q`, `d * q + m`), so the result is bit-identical to it.
//!
//! Every function takes whole blocks (`bytes.len()` a multiple of the block size) and writes
//! `out` (values per block × blocks); the caller checks the lengths.
//!
//! Not for: the 256-value k-quants (`kquants.rs`).

use half::{bf16, f16};

/// Values per block of the formats in this file (ggml's `QK4_0`, `QK4_1`, `QK5_0`, `QK5_1`,
/// `QK8_0`).
const QK: usize = 32;

pub(super) fn half_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// F32: 4 bytes per value, little-endian IEEE single precision.
pub fn f32_values(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// F16: 2 bytes per value, IEEE half precision (widening is exact).
pub fn f16_values(bytes: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = half_at(bytes, 2 * i);
    }
}

/// BF16: 2 bytes per value, the upper half of an f32 (widening is exact).
pub fn bf16_values(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// Q4_0, 18 bytes per 32 values: `d` (f16), then 16 bytes of 4-bit codes; byte j holds value
/// j in its low nibble and value j + 16 in its high nibble; `x = d · (q − 8)`.
pub fn q4_0(bytes: &[u8], out: &mut [f32]) {
    for (block, y) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(QK)) {
        let d = half_at(block, 0);
        for (j, &q) in block[2..].iter().enumerate() {
            y[j] = d * ((q & 0x0F) as i32 - 8) as f32;
            y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
        }
    }
}

/// Q4_1, 20 bytes per 32 values: `d` (f16), the minimum `m` (f16), then 16 bytes of 4-bit
/// codes packed as in Q4_0; `x = d · q + m`.
pub fn q4_1(bytes: &[u8], out: &mut [f32]) {
    for (block, y) in bytes.chunks_exact(20).zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (half_at(block, 0), half_at(block, 2));
        for (j, &q) in block[4..].iter().enumerate() {
            y[j] = d * (q & 0x0F) as f32 + m;
            y[j + 16] = d * (q >> 4) as f32 + m;
        }
    }
}

/// The fifth bits of a 5-bit block: `qh` (a little-endian u32) holds bit 4 of value j at bit j.
fn high_bits(block: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
}

/// Q5_0, 22 bytes per 32 values: `d` (f16), `qh` (4 bytes: bit j is the fifth bit of value j),
/// then 16 bytes of low nibbles packed as in Q4_0; `x = d · (q − 16)`.
pub fn q5_0(bytes: &[u8], out: &mut [f32]) {
    for (block, y) in bytes.chunks_exact(22).zip(out.chunks_exact_mut(QK)) {
        let d = half_at(block, 0);
        let qh = high_bits(block, 2);
        for (j, &q) in block[6..].iter().enumerate() {
            let lo = (q & 0x0F) as u32 | ((qh >> j) & 1) << 4;
            let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (lo as i32 - 16) as f32;
            y[j + 16] = d * (hi as i32 - 16) as f32;
        }
    }
}

/// Q5_1, 24 bytes per 32 values: `d` (f16), the minimum `m` (f16), `qh` (4 bytes, as in Q5_0),
/// then 16 bytes of low nibbles; `x = d · q + m`.
pub fn q5_1(bytes: &[u8], out: &mut [f32]) {
    for (block, y) in bytes.chunks_exact(24).zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (half_at(block, 0), half_at(block, 2));
        let qh = high_bits(block, 4);
        for (j, &q) in block[8..].iter().enumerate() {
            let lo = (q & 0x0F) as u32 | ((qh >> j) & 1) << 4;
            let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * lo as f32 + m;
            y[j + 16] = d * hi as f32 + m;
        }
    }
}

/// Q8_0, 34 bytes per 32 values: `d` (f16), then 32 signed bytes; `x = d · q`.
pub fn q8_0(bytes: &[u8], out: &mut [f32]) {
    for (block, y) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(QK)) {
        let d = half_at(block, 0);
        for (o, &q) in y.iter_mut().zip(&block[2..]) {
            *o = d * (q as i8) as f32;
        }
    }
}
