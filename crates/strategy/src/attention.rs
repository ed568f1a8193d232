//! The attention implementation, a memory lever: naive attention saves the (B, H, T, T)
//! probabilities for backward; memory-efficient attention (FlashAttention's tiling, Dao et al.
//! 2022) saves O(T) row statistics instead.
//!
//! Not for: the kernels (the tensor crate).

use crate::named::named_enum;

named_enum!(
    #[derive(Default)]
    /// Attention implementation.
    Attention, "--attention", {
        /// Scores and probabilities materialised (s² per head).
        #[default]
        Naive = "naive",
        /// Flash/memory-efficient attention: O(s) extra memory.
        MemoryEfficient = "memory-efficient",
    }
);
