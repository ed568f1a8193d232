//! ggml's k-quants (super-blocks of 256 values, `QK_K`), decoded to f32: Q2_K, Q3_K, Q4_K,
//! Q5_K and Q6_K.
//!
//! Layouts are ggml's (ggml-org/ggml: `src/ggml-common.h` `block_q2_K` … `block_q6_K`,
//! decoded as in `src/ggml-quants.c` `dequantize_row_q2_K` …; llama.cpp's
//! `gguf-py/gguf/quants.py` decodes the same blocks with numpy). Each sub-block's scale is
//! formed first (`dl = d · scale`, `ml = dmin · min`) and the value as `dl · q − ml`, the
//! reference's f32 operations in its order, so the result is bit-identical to it.
//!
//! In the descriptions, value `p` (0 ≤ p < 256) of a super-block lies in half `h = p / 128`,
//! quarter `k = (p mod 128) / 32` of that half, at lane `l = p mod 32`.
//!
//! Not for: the 32-value formats (`blocks.rs`).

use super::blocks::half_at;

const QK_K: usize = 256;

/// Q2_K, 84 bytes: `scales` (16 bytes; sub-block s of 16 values has scale `scales[s] & 15` and
/// min `scales[s] >> 4`), `qs` (64 bytes of 2-bit codes: value p is
/// `(qs[32h + l] >> 2k) & 3`), `d` (f16), `dmin` (f16); `x = d·scale·q − dmin·min`.
pub fn q2_k(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.chunks_exact(84).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (half_at(b, 80), half_at(b, 82));
        for (p, o) in y.iter_mut().enumerate() {
            let (h, k, l) = (p / 128, (p % 128) / 32, p % 32);
            let sc = b[p / 16];
            let q = (b[16 + 32 * h + l] >> (2 * k)) & 3;
            *o = d * (sc & 0x0F) as f32 * q as f32 - dmin * (sc >> 4) as f32;
        }
    }
}

/// Q3_K, 110 bytes: `hmask` (32 bytes: bit `p / 32` of `hmask[l]` is value p's high bit),
/// `qs` (64 bytes of 2-bit codes as in Q2_K), `scales` (12 bytes: 16 six-bit scales, the low
/// 4 bits of scale i in nibble `i / 8` of byte `i mod 8`, the high 2 bits at bit `2·(i / 4)`
/// of byte `8 + i mod 4`, stored plus 32), `d` (f16); `x = d·(scale − 32)·(q − 4·(1 − high))`.
pub fn q3_k(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.chunks_exact(110).zip(out.chunks_exact_mut(QK_K)) {
        let d = half_at(b, 108);
        let scales = &b[96..108];
        let scale = |i: usize| {
            let low = (scales[i % 8] >> (4 * (i / 8))) & 0x0F;
            let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
            ((low | high << 4) as i32 - 32) as f32
        };
        for (p, o) in y.iter_mut().enumerate() {
            let (h, k, l) = (p / 128, (p % 128) / 32, p % 32);
            let low = ((b[32 + 32 * h + l] >> (2 * k)) & 3) as i32;
            let high = ((b[l] >> (p / 32)) & 1) as i32;
            *o = d * scale(p / 16) * (low - 4 * (1 - high)) as f32;
        }
    }
}

/// The scale and min of sub-block `j` (0..8) of Q4_K and Q5_K, six bits each, from their
/// 12-byte packing (ggml-quants.c `get_scale_min_k4`): for j < 4, `scales[j] & 63` and
/// `scales[j + 4] & 63`; for j ≥ 4, the low 4 bits from byte `j + 4` (low and high nibble) and
/// the high 2 bits from the top of bytes `j − 4` and `j`.
fn scale_min_k4(scales: &[u8], j: usize) -> (f32, f32) {
    let (sc, m) = match j < 4 {
        true => (scales[j] & 63, scales[j + 4] & 63),
        false => (
            (scales[j + 4] & 0x0F) | (scales[j - 4] >> 6) << 4,
            (scales[j + 4] >> 4) | (scales[j] >> 6) << 4,
        ),
    };
    (sc as f32, m as f32)
}

/// Q4_K, 144 bytes: `d` (f16), `dmin` (f16), `scales` (12 bytes, see [`scale_min_k4`]; one
/// scale and min per sub-block of 32), `qs` (128 bytes: value p of 64-value chunk c is the low
/// nibble of `qs[32c + l]` if `p mod 64 < 32`, else its high nibble); `x = d·sc·q − dmin·m`.
pub fn q4_k(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.chunks_exact(144).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (half_at(b, 0), half_at(b, 2));
        for (j, sub) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(&b[4..16], j);
            let (dl, ml) = (d * sc, dmin * m);
            let qs = &b[16 + 32 * (j / 2)..][..32];
            for (l, o) in sub.iter_mut().enumerate() {
                let q = (qs[l] >> (4 * (j % 2))) & 0x0F;
                *o = dl * q as f32 - ml;
            }
        }
    }
}

/// Q5_K, 176 bytes: `d` (f16), `dmin` (f16), `scales` (12 bytes, as Q4_K), `qh` (32 bytes: bit
/// j of `qh[l]` is the fifth bit of lane l of sub-block j), `qs` (128 bytes of low nibbles, as
/// Q4_K); `x = d·sc·q − dmin·m`.
pub fn q5_k(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.chunks_exact(176).zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (half_at(b, 0), half_at(b, 2));
        let qh = &b[16..48];
        for (j, sub) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(&b[4..16], j);
            let (dl, ml) = (d * sc, dmin * m);
            let qs = &b[48 + 32 * (j / 2)..][..32];
            for (l, o) in sub.iter_mut().enumerate() {
                let q = (qs[l] >> (4 * (j % 2))) & 0x0F | ((qh[l] >> j) & 1) << 4;
                *o = dl * q as f32 - ml;
            }
        }
    }
}

/// Q6_K, 210 bytes: `ql` (128 bytes: value p takes the low nibble of `ql[64h + 32(k mod 2) +
/// l]` for k < 2, the high nibble for k ≥ 2), `qh` (64 bytes: bits `2k, 2k+1` of `qh[32h + l]`
/// are value p's top two bits), `scales` (16 signed bytes, one per sub-block of 16), `d`
/// (f16); `x = d·scale·(q − 32)`.
pub fn q6_k(bytes: &[u8], out: &mut [f32]) {
    for (b, y) in bytes.chunks_exact(210).zip(out.chunks_exact_mut(QK_K)) {
        let d = half_at(b, 208);
        for (p, o) in y.iter_mut().enumerate() {
            let (h, k, l) = (p / 128, (p % 128) / 32, p % 32);
            let low = (b[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
            let high = (b[128 + 32 * h + l] >> (2 * k)) & 3;
            let q = (low | high << 4) as i32 - 32;
            let scale = b[192 + p / 16] as i8;
            *o = d * scale as f32 * q as f32;
        }
    }
}
