//! The AMX tile instructions of the bf16 GEMM (`amx`), as inline assembly (stable Rust has no
//! AMX intrinsics yet): the palette-1 tile configuration (`LDTILECFG`, released by
//! `TILERELEASE`) and the 2 × 2 tile loop (`TILELOADD`, `TDPBF16PS`, `TILESTORED`) that
//! accumulates one 32 × 32 block of C over a slab of k.
//!
//! Not for: the packing or the threads (`amx_pack`, `amx`).

use super::amx::{BLOCK, PANEL};
use std::arch::asm;

/// The tile shapes every task uses (palette 1): C tiles 0–3, A tiles 4–5 and B tiles 6–7, each
/// 16 rows of 64 bytes. Loading it zeroes the tiles; dropping it releases them (`TILERELEASE`,
/// so a context switch saves no tile state).
pub(super) struct TileConfig;

impl TileConfig {
    pub(super) fn load() -> TileConfig {
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        let mut cfg = Config([0; 64]);
        cfg.0[0] = 1; // palette 1
        for t in 0..8 {
            cfg.0[16 + 2 * t] = 64; // bytes per row
            cfg.0[48 + t] = 16; // rows
        }
        // SAFETY: `supported()` held (asserted in `matmul`), and the 64-byte configuration is a
        // valid palette-1 layout of eight 16 × 64-byte tiles.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        TileConfig
    }
}

impl Drop for TileConfig {
    fn drop(&mut self) {
        // SAFETY: releases the tile state loaded by `load`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// C (32 × 32 f32, `sums`) = A (32 rows at `a`, `a_stride` bytes apart) · B (two panels of
/// `pairs` k-pair rows × 16 columns at `b`), over `tiles ≥ 1` steps of 16 k-pairs, from zero
/// or, when `reload`, added to the sums already in `sums` (the f32 tiles load and store
/// exactly, so splitting k this way gives the same bits as one pass).
///
/// # Safety
/// The tile configuration of [`TileConfig`] is loaded on this thread; `a` holds 32 rows of
/// `tiles · 64` bytes at `a_stride` bytes, `b` two panels of `pairs ≥ tiles · 16` rows of 16
/// dwords.
pub(super) unsafe fn tiles_2x2(
    a: *const u8,
    a_stride: usize,
    b: *const u32,
    pairs: usize,
    tiles: usize,
    reload: bool,
    sums: &mut [f32; BLOCK * BLOCK],
) {
    // SAFETY (for the pointer arithmetic): every offset lies inside the rows and panels the
    // caller guarantees.
    unsafe {
        let a1 = a.add(16 * a_stride);
        let b1 = b.add(pairs * PANEL);
        let c = sums.as_mut_ptr();
        if reload {
            asm!(
                "tileloadd tmm0, [{c0} + {sc}*1]",
                "tileloadd tmm1, [{c1} + {sc}*1]",
                "tileloadd tmm2, [{c2} + {sc}*1]",
                "tileloadd tmm3, [{c3} + {sc}*1]",
                c0 = in(reg) c,
                c1 = in(reg) c.add(16),
                c2 = in(reg) c.add(16 * BLOCK),
                c3 = in(reg) c.add(16 * BLOCK + 16),
                sc = in(reg) BLOCK * 4,
                options(nostack, readonly),
            );
        } else {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem),
            );
        }
        asm!(
            "2:",
            "tileloadd tmm4, [{a0} + {sa}*1]",
            "tileloadd tmm5, [{a1} + {sa}*1]",
            "tileloadd tmm6, [{b0} + {sb}*1]",
            "tileloadd tmm7, [{b1} + {sb}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a0}, 64",
            "add {a1}, 64",
            "add {b0}, 1024",
            "add {b1}, 1024",
            "dec {n}",
            "jnz 2b",
            "tilestored [{c0} + {sc}*1], tmm0",
            "tilestored [{c1} + {sc}*1], tmm1",
            "tilestored [{c2} + {sc}*1], tmm2",
            "tilestored [{c3} + {sc}*1], tmm3",
            a0 = inout(reg) a => _,
            a1 = inout(reg) a1 => _,
            b0 = inout(reg) b => _,
            b1 = inout(reg) b1 => _,
            n = inout(reg) tiles => _,
            sa = in(reg) a_stride,
            sb = in(reg) 64usize,
            c0 = in(reg) c,
            c1 = in(reg) c.add(16),
            c2 = in(reg) c.add(16 * BLOCK),
            c3 = in(reg) c.add(16 * BLOCK + 16),
            sc = in(reg) BLOCK * 4,
            options(nostack),
        );
    }
}
