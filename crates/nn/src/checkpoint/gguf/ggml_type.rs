//! The ggml tensor types a GGUF file may hold: their numeric ids, names, and block geometry
//! (values per block, bytes per block), as ggml defines them (ggml-org/ggml:
//! `include/ggml.h` `enum ggml_type`, `src/ggml.c` `type_traits`; the same table is
//! `GGML_QUANT_SIZES` in llama.cpp's `gguf-py/gguf/constants.py`), and which of them headroom
//! dequantises.
//!
//! Every type's geometry is known, so the container can bounds-check a tensor of a type
//! headroom does not dequantise and report it by name only when it is read.
//!
//! Not for: the block formats themselves (`blocks.rs`, `kquants.rs`).

use super::blocks;
use super::kquants;

/// A ggml tensor type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    /// Values per block (1 for plain floats and integers).
    pub block_values: usize,
    /// Bytes per block.
    pub block_bytes: usize,
}

/// Decodes whole blocks of one type into f32 (`out.len()` = blocks × values per block).
pub type Dequantize = fn(&[u8], &mut [f32]);

const fn t(id: u32, name: &'static str, block_values: usize, block_bytes: usize) -> GgmlType {
    GgmlType {
        id,
        name,
        block_values,
        block_bytes,
    }
}

/// Every ggml type in current files (ids 4, 5 and 31 to 33, 36 to 38 were removed from ggml).
const TYPES: [GgmlType; 34] = [
    t(0, "F32", 1, 4),
    t(1, "F16", 1, 2),
    t(2, "Q4_0", 32, 18),
    t(3, "Q4_1", 32, 20),
    t(6, "Q5_0", 32, 22),
    t(7, "Q5_1", 32, 24),
    t(8, "Q8_0", 32, 34),
    t(9, "Q8_1", 32, 36),
    t(10, "Q2_K", 256, 84),
    t(11, "Q3_K", 256, 110),
    t(12, "Q4_K", 256, 144),
    t(13, "Q5_K", 256, 176),
    t(14, "Q6_K", 256, 210),
    t(15, "Q8_K", 256, 292),
    t(16, "IQ2_XXS", 256, 66),
    t(17, "IQ2_XS", 256, 74),
    t(18, "IQ3_XXS", 256, 98),
    t(19, "IQ1_S", 256, 50),
    t(20, "IQ4_NL", 32, 18),
    t(21, "IQ3_S", 256, 110),
    t(22, "IQ2_S", 256, 82),
    t(23, "IQ4_XS", 256, 136),
    t(24, "I8", 1, 1),
    t(25, "I16", 1, 2),
    t(26, "I32", 1, 4),
    t(27, "I64", 1, 8),
    t(28, "F64", 1, 8),
    t(29, "IQ1_M", 256, 56),
    t(30, "BF16", 1, 2),
    t(34, "TQ1_0", 256, 54),
    t(35, "TQ2_0", 256, 66),
    t(39, "MXFP4", 32, 17),
    t(40, "NVFP4", 64, 36),
    t(41, "Q1_0", 128, 18),
];

/// The types headroom dequantises, with their decoders.
const DEQUANTISED: [(&str, Dequantize); 13] = [
    ("F32", blocks::f32_values),
    ("F16", blocks::f16_values),
    ("BF16", blocks::bf16_values),
    ("Q4_0", blocks::q4_0),
    ("Q4_1", blocks::q4_1),
    ("Q5_0", blocks::q5_0),
    ("Q5_1", blocks::q5_1),
    ("Q8_0", blocks::q8_0),
    ("Q2_K", kquants::q2_k),
    ("Q3_K", kquants::q3_k),
    ("Q4_K", kquants::q4_k),
    ("Q5_K", kquants::q5_k),
    ("Q6_K", kquants::q6_k),
];

impl GgmlType {
    /// The type with ggml id `id`, if ggml defines one.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().copied().find(|t| t.id == id)
    }

    /// The decoder of this type, if headroom has one.
    pub fn dequantizer(&self) -> Option<Dequantize> {
        DEQUANTISED
            .iter()
            .find(|(name, _)| *name == self.name)
            .map(|&(_, f)| f)
    }

    /// The names of the types headroom dequantises, comma-separated.
    pub fn supported() -> String {
        DEQUANTISED.map(|(name, _)| name).join(", ")
    }
}
