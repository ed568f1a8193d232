//! The AMX bf16 GEMM: `TDPBF16PS` on tile registers (Intel Advanced Matrix Extensions, Intel
//! SDM vol. 1 ch. 18 and the Intel Intrinsics Guide: `_tile_dpbf16ps`), on Xeons from Sapphire
//! Rapids on. One instruction multiplies a 16 × 32 bf16 tile of A by a 32 × 16 tile of B into a
//! 16 × 16 f32 tile of C: 16,384 flop, 1,024 flop a cycle at its throughput, 16 times the
//! AVX-512 FMA rate of the same core (`VDPBF16PS` runs at the f32 FMA rate on these cores, so
//! the native kernel gains nothing there; docs/sources.md §27).
//!
//! Stable Rust has no AMX intrinsics yet, so the instructions are written as inline assembly;
//! tiles are not registers the compiler allocates, and they hold their values between
//! statements as long as nothing else on the thread uses AMX (nothing does). Linux hands a
//! process AMX's 8 KiB of tile state only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`, the kernel's Documentation/arch/x86/xstate.rst); [`supported`] asks
//! once and reports whether the CPU has the instructions and the OS granted them.
//!
//! How one product `C (m × n) = A (m × k) · B (k × n)` runs:
//! 1. B is packed once into panels of 16 columns: within panel j, k-pair p holds the 16
//!    columns' pairs `(B[2p][c], B[2p+1][c])` as dwords, so 16 consecutive pairs are one B tile
//!    (16 rows of 64 bytes, contiguous). k is padded with zero pairs to a multiple of 32 and n
//!    with zero columns to a multiple of 32.
//! 2. C is cut into blocks of 32 rows, one task each (rayon). A task packs its 32 rows of A
//!    row-major with the same zero padding (each row's k contiguous: 16 pairs are one A tile
//!    row), then for every 32 columns of C keeps four C tiles (2 × 2) in registers over all of
//!    k, loading two A and two B tiles per 32 of k, and stores them once.
//! 3. The f32 sums are rounded once to bf16 (round-to-nearest-even, `VCVTNEPS2BF16`) into C.
//!
//! Deterministic: each element of C is one tile accumulator over all of k, in order, on one
//! thread, so the bits do not depend on the thread count. `TDPBF16PS` treats subnormal inputs
//! and outputs as zero, like `VDPBF16PS`.
//!
//! Not for: CPUs without AMX (the `VDPBF16PS` kernel, then widening), shape checks or batches'
//! broadcasting (the ops layer).

use super::pack::Strided;
use super::{slots, small};
use crate::backend::cpu::Scratch;
use crate::backend::cpu::matmul::{Dims, split};
use crate::error::Result;
use crate::shape::Layout;
use half::bf16;
use headroom_memory::Device;
use rayon::prelude::*;
use std::arch::asm;
use std::sync::OnceLock;

/// Rows (and columns) of C per task block: 2 × 2 tiles of 16.
const BLOCK: usize = 32;
/// Columns of a packed B panel (one tile's width).
const PANEL: usize = 16;
/// k-pairs per tile (32 bf16 of k: a tile row is 64 bytes).
const TILE_PAIRS: usize = 16;

/// Whether the CPU has AMX-TILE and AMX-BF16 and the OS lets this process use the tile data.
pub fn supported() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512bf16")
            && cpu_has_amx()
            && os_grants_amx()
    })
}

/// CPUID leaf 7, sub-leaf 0: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE (Intel SDM vol. 2,
/// CPUID). The tile state must also be enabled in XCR0 (bits 17 and 18), which the
/// permission request below checks on Linux.
fn cpu_has_amx() -> bool {
    // Leaf 0 says whether leaf 7 exists.
    let max_leaf = std::arch::x86_64::__cpuid(0).eax;
    if max_leaf < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

#[cfg(target_os = "linux")]
fn os_grants_amx() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes a feature number and touches no memory;
    // a kernel or CPU without the feature answers with an error code.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    r == 0
}

#[cfg(not(target_os = "linux"))]
fn os_grants_amx() -> bool {
    false
}

/// Sizes of one product's packed operands, in dwords (one k-pair each).
#[derive(Debug, Clone, Copy)]
struct Padded {
    /// k-pairs, padded to whole tiles.
    pairs: usize,
    rows: usize,
    cols: usize,
}

impl Padded {
    fn of(d: &Dims) -> Padded {
        Padded {
            pairs: d.k.div_ceil(2 * TILE_PAIRS) * TILE_PAIRS,
            rows: d.m.div_ceil(BLOCK) * BLOCK,
            cols: d.n.div_ceil(BLOCK) * BLOCK,
        }
    }
    fn a_words(&self) -> usize {
        self.rows * self.pairs
    }
    fn b_words(&self) -> usize {
        self.cols * self.pairs
    }
}

/// The `temporary` scratch of the AMX kernel: packed A and B for `slots(d)` batch elements. It
/// depends on the dims only, so the shape-only backend's dry runs allocate exactly these bytes.
pub(crate) fn scratch(device: &Device, d: Dims) -> Result<[Scratch; 2]> {
    let (p, s) = (Padded::of(&d), slots(&d));
    Ok([
        crate::backend::cpu::scratch_f32(device, s * p.a_words(), "matmul.bf16.amx_lhs")?,
        crate::backend::cpu::scratch_f32(device, s * p.b_words(), "matmul.bf16.amx_rhs")?,
    ])
}

/// bf16 `out (batch, m, n) = a @ b` on AMX tiles.
///
/// # Panics
/// When [`supported`] is false (callers check it through `bf16_gemm::bf16_gemm`).
pub(crate) fn matmul(
    device: &Device,
    a: &[bf16],
    la: &Layout,
    b: &[bf16],
    lb: &Layout,
    out: &mut [bf16],
    d: Dims,
) -> Result<()> {
    assert!(
        supported(),
        "the AMX bf16 GEMM needs AMX-BF16 and the OS's permission"
    );
    let (ba, ars, acs) = split(la);
    let (bb, brs, bcs) = split(lb);
    let (a, b): (&[u16], &[u16]) = (bytemuck::cast_slice(a), bytemuck::cast_slice(b));
    let out: &mut [u16] = bytemuck::cast_slice_mut(out);
    let p = Padded::of(&d);
    let [mut sa, mut sb] = scratch(device, d)?;
    let pa: &mut [u32] = bytemuck::cast_slice_mut(sa.slice_mut());
    let pb: &mut [u32] = bytemuck::cast_slice_mut(sb.slice_mut());
    let view = |data, off, rs: isize, cs: isize| Strided {
        data,
        off,
        rs: rs as usize,
        cs: cs as usize,
    };
    let slots = slots(&d);
    let parallel_inside = slots == 1 && !small(&d);
    let mut first = 0;
    for out_chunk in out.chunks_mut(slots * d.m * d.n) {
        let count = out_chunk.len() / (d.m * d.n);
        let one = |i: usize, o: &mut [u16], pa: &mut [u32], pb: &mut [u32]| {
            let av = view(a, ba.index_of(first + i), ars, acs);
            let bv = view(b, bb.index_of(first + i), brs, bcs);
            product(
                av,
                bv,
                o,
                &mut pa[..p.a_words()],
                &mut pb[..p.b_words()],
                &d,
                parallel_inside,
            );
        };
        if count == 1 {
            one(0, out_chunk, pa, pb);
        } else {
            out_chunk
                .par_chunks_mut(d.m * d.n)
                .zip(pa.par_chunks_mut(p.a_words()))
                .zip(pb.par_chunks_mut(p.b_words()))
                .enumerate()
                .for_each(|(i, ((o, pa), pb))| one(i, o, pa, pb));
        }
        first += count;
    }
    Ok(())
}

/// A raw pointer to C that tasks share: each writes only its own block of rows.
#[derive(Debug, Clone, Copy)]
struct OutPtr(*mut u16);
// SAFETY: tasks write disjoint row blocks of C through it (see `product`), and C outlives them.
unsafe impl Send for OutPtr {}
// SAFETY: as above; no task reads C.
unsafe impl Sync for OutPtr {}

/// One product: B packed (in parallel over panels), then one task per 32 rows of C, each packing
/// its rows of A and running the tiles.
fn product(
    a: Strided,
    b: Strided,
    out: &mut [u16],
    pa: &mut [u32],
    pb: &mut [u32],
    d: &Dims,
    parallel: bool,
) {
    let p = Padded::of(d);
    let panel_words = p.pairs * PANEL;
    let pack_panel = |j: usize, dst: &mut [u32]| pack_b(b, d.k, d.n, j * PANEL, dst);
    let block_words = BLOCK * p.pairs;
    let c = OutPtr(out.as_mut_ptr());
    let pb_ref: &[u32];
    if parallel {
        pb.par_chunks_mut(panel_words)
            .enumerate()
            .for_each(|(j, dst)| pack_panel(j, dst));
        pb_ref = pb;
        pa.par_chunks_mut(block_words)
            .enumerate()
            .for_each(|(r, blk)| row_block(a, r, blk, pb_ref, c, d, p));
    } else {
        for (j, dst) in pb.chunks_mut(panel_words).enumerate() {
            pack_panel(j, dst);
        }
        pb_ref = pb;
        for (r, blk) in pa.chunks_mut(block_words).enumerate() {
            row_block(a, r, blk, pb_ref, c, d, p);
        }
    }
}

/// Task `r`: rows `32·r ..` of C. Packs those rows of A into `pa` (32 rows of `p.pairs`
/// dwords), then runs every 32-column block of C over all of k on the tiles.
fn row_block(a: Strided, r: usize, pa: &mut [u32], pb: &[u32], c: OutPtr, d: &Dims, p: Padded) {
    let r0 = r * BLOCK;
    pack_a_rows(a, d.m, d.k, r0, p.pairs, pa);
    let rows = BLOCK.min(d.m - r0);
    let mut sums = [0f32; BLOCK * BLOCK];
    let tiles = p.pairs / TILE_PAIRS;
    let a_stride = p.pairs * 4;
    let _config = TileConfig::load();
    for cb in 0..p.cols / BLOCK {
        let b0 = &pb[2 * cb * p.pairs * PANEL..][..2 * p.pairs * PANEL];
        // SAFETY: the tile configuration is loaded (`_config`); the A rows hold 32 × `pairs`
        // dwords and the two B panels `pairs` × 16 each, so every tile load of the `tiles`
        // steps stays inside them; `sums` holds 32 × 32 f32 for the stores.
        unsafe {
            tiles_2x2(
                pa.as_ptr(),
                a_stride,
                b0.as_ptr(),
                p.pairs,
                tiles,
                &mut sums,
            )
        };
        let c0 = cb * BLOCK;
        let cols = BLOCK.min(d.n - c0);
        for (i, row) in sums.chunks_exact(BLOCK).take(rows).enumerate() {
            // SAFETY: AVX512F/BW/VL and AVX512_BF16 are present (`supported`); row r0 + i < m
            // and columns c0 .. c0 + cols ≤ n lie inside the m × n C, and only this task writes
            // rows r0 .. r0 + 32.
            unsafe { round_row(row, c.0.add((r0 + i) * d.n + c0), cols) };
        }
    }
}

/// Rounds the first `cols` (≤ 32) of one row of f32 sums to bf16 at `dst`
/// (`VCVTNEPS2BF16`: round-to-nearest-even, like `half`'s conversion, but subnormal results
/// flushed to zero, as the native kernel's store does).
///
/// # Safety
/// AVX512F/BW/VL and AVX512_BF16 are present; `dst` is valid for `cols` u16 writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn round_row(row: &[f32], dst: *mut u16, cols: usize) {
    use std::arch::x86_64::*;
    for half in 0..2 {
        let from = 16 * half;
        if cols <= from {
            break;
        }
        let n = (cols - from).min(16);
        // SAFETY: `row` holds 32 f32; `dst + from` is valid for `n` u16 writes, and the mask
        // writes only those.
        unsafe {
            let v = _mm512_loadu_ps(row[from..].as_ptr());
            let h = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v));
            _mm256_mask_storeu_epi16(dst.add(from).cast(), (1u32 << n).wrapping_sub(1) as u16, h);
        }
    }
}

/// The tile shapes every task uses (palette 1): C tiles 0–3, A tiles 4–5 and B tiles 6–7, each
/// 16 rows of 64 bytes. Loading it zeroes the tiles; dropping it releases them (`TILERELEASE`,
/// so a context switch saves no tile state).
struct TileConfig;

impl TileConfig {
    fn load() -> TileConfig {
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
/// `pairs` k-pair rows × 16 columns at `b`), over `tiles` steps of 16 k-pairs.
///
/// # Safety
/// The tile configuration of [`TileConfig`] is loaded on this thread; `a` holds 32 rows of
/// `tiles · 16` dwords at `a_stride` bytes, `b` two panels of `pairs ≥ tiles · 16` rows of 16
/// dwords.
unsafe fn tiles_2x2(
    a: *const u32,
    a_stride: usize,
    b: *const u32,
    pairs: usize,
    tiles: usize,
    sums: &mut [f32; BLOCK * BLOCK],
) {
    if tiles == 0 {
        sums.fill(0.0);
        return;
    }
    // SAFETY (for the pointer arithmetic): every offset lies inside the rows and panels the
    // caller guarantees.
    unsafe {
        let a1 = a.cast::<u8>().add(16 * a_stride).cast::<u32>();
        let b1 = b.add(pairs * PANEL);
        let c = sums.as_mut_ptr();
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
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

/// Two bf16 bit patterns as one dword: `lo` (even k) in bits 0..16, `hi` (odd k) above.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// Rows `r0 .. r0 + 32` of A (m × k) into `dst`: row i's k-pairs at `i·pairs ..`, zero past k
/// and past m.
fn pack_a_rows(a: Strided, m: usize, k: usize, r0: usize, pairs: usize, dst: &mut [u32]) {
    let rows = BLOCK.min(m - r0);
    let full = k / 2;
    // Only the padding needs zeros: past the last row, and each row past its last whole pair
    // (an odd k's last pair is written with a zero high half below).
    dst[rows * pairs..].fill(0);
    for row in dst.chunks_mut(pairs).take(rows) {
        row[full..].fill(0);
    }
    if a.cs == 1 {
        // Row-major: each row's k is contiguous, already in pair order.
        let dst16: &mut [u16] = bytemuck::cast_slice_mut(dst);
        for i in 0..rows {
            let src = &a.data[a.off + (r0 + i) * a.rs..][..k];
            dst16[i * 2 * pairs..][..k].copy_from_slice(src);
        }
        return;
    }
    if a.rs == 1 {
        // Transposed: for each k the block's rows are contiguous. Whole 16-row × 16-pair
        // squares go through registers (`transposed_square`); the ragged rest pair by pair.
        let (sq_rows, sq_pairs) = (rows / 16 * 16, full / 16 * 16);
        for i0 in (0..sq_rows).step_by(16) {
            for p0 in (0..sq_pairs).step_by(16) {
                // SAFETY: AVX-512 is present (`supported`); rows i0..i0 + 16 < `rows` and k
                // up to 2·(p0 + 16) ≤ k exist in A, and dst holds 32 rows of `pairs` dwords.
                unsafe { transposed_square(a, r0 + i0, p0, &mut dst[i0 * pairs + p0..], pairs) };
            }
        }
        for p in 0..full {
            let lo = &a.data[a.off + r0 + 2 * p * a.cs..][..rows];
            let hi = &a.data[a.off + r0 + (2 * p + 1) * a.cs..][..rows];
            let from = if p < sq_pairs { sq_rows } else { 0 };
            for i in from..rows {
                dst[i * pairs + p] = pair(lo[i], hi[i]);
            }
        }
    } else {
        for i in 0..rows {
            for p in 0..full {
                dst[i * pairs + p] = pair(a.at(r0 + i, 2 * p), a.at(r0 + i, 2 * p + 1));
            }
        }
    }
    if k % 2 == 1 {
        for i in 0..rows {
            dst[i * pairs + full] = pair(a.at(r0 + i, k - 1), 0);
        }
    }
}

/// Rows `i0 .. i0 + 16` × pairs `p0 .. p0 + 16` of a transposed A (each k's rows contiguous)
/// into `dst` (row i's 16 pairs at `i·pairs`): 16 vectors of one pair per row, transposed as a
/// 16 × 16 dword matrix in registers (unpack 32- and 64-bit, then two 128-bit lane shuffles).
///
/// # Safety
/// AVX512F is present; A has rows `i0 .. i0 + 16` and k up to `2·p0 + 32`; `dst` holds 15 rows
/// of `pairs` dwords and 16 more.
#[target_feature(enable = "avx512f")]
unsafe fn transposed_square(a: Strided, i0: usize, p0: usize, dst: &mut [u32], pairs: usize) {
    use std::arch::x86_64::*;
    let zero = _mm512_setzero_si512();
    let mut r = [zero; 16];
    for (q, v) in r.iter_mut().enumerate() {
        let k = 2 * (p0 + q);
        let lo = &a.data[a.off + i0 + k * a.cs..][..16];
        let hi = &a.data[a.off + i0 + (k + 1) * a.cs..][..16];
        // SAFETY: AVX512F is present (the caller's contract); both slices hold 16 values.
        *v = unsafe { pairs16(lo, hi) };
    }
    // SAFETY: AVX512F is present (the caller's contract).
    unsafe { transpose16(&mut r) };
    for (i, row) in r.iter().enumerate() {
        let out = &mut dst[i * pairs..][..16];
        // SAFETY: `out` holds 16 dwords (64 bytes).
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), *row) };
    }
}

/// Transposes a 16 × 16 matrix of dwords held as 16 row vectors: unpack 32- and 64-bit
/// halves, then two rounds of 128-bit lane shuffles.
///
/// # Safety
/// AVX512F is present.
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(r: &mut [std::arch::x86_64::__m512i; 16]) {
    use std::arch::x86_64::*;
    let zero = _mm512_setzero_si512();
    let mut t = [zero; 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [zero; 16];
    for i in 0..4 {
        let b = 4 * i;
        u[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
        u[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
        u[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
        u[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
    }
    let mut v = [zero; 16];
    for i in 0..4 {
        v[i] = _mm512_shuffle_i32x4::<0x88>(u[i], u[i + 4]);
        v[i + 4] = _mm512_shuffle_i32x4::<0xdd>(u[i], u[i + 4]);
        v[i + 8] = _mm512_shuffle_i32x4::<0x88>(u[i + 8], u[i + 12]);
        v[i + 12] = _mm512_shuffle_i32x4::<0xdd>(u[i + 8], u[i + 12]);
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_i32x4::<0x88>(v[i], v[i + 8]);
        r[i + 8] = _mm512_shuffle_i32x4::<0xdd>(v[i], v[i + 8]);
    }
}

/// Two rows of 16 bf16 (`lo` at even k, `hi` at odd k) as 16 pair dwords.
///
/// # Safety
/// AVX512F is present; both slices hold at least 16 values.
#[target_feature(enable = "avx512f")]
unsafe fn pairs16(lo: &[u16], hi: &[u16]) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: both slices hold 16 u16 (32 bytes).
    let (lo, hi) = unsafe {
        (
            _mm256_loadu_si256(lo[..16].as_ptr().cast()),
            _mm256_loadu_si256(hi[..16].as_ptr().cast()),
        )
    };
    _mm512_or_si512(
        _mm512_cvtepu16_epi32(lo),
        _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)),
    )
}

/// Pairs `p0 .. p0 + 16` of columns `c0 .. c0 + 16` of a transposed B (each column's k
/// contiguous) into `dst` (pair row p's 16 columns at `p·16`): each column's 16 pairs are one
/// vector, transposed in registers.
///
/// # Safety
/// AVX512F is present; B has columns `c0 .. c0 + 16` and k up to `2·p0 + 32`.
#[target_feature(enable = "avx512f")]
unsafe fn transposed_b_square(b: Strided, c0: usize, p0: usize, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    let mut r = [_mm512_setzero_si512(); 16];
    for (c, v) in r.iter_mut().enumerate() {
        let col = &b.data[b.off + (c0 + c) * b.cs + 2 * p0..][..32];
        // SAFETY: `col` holds 32 u16 (64 bytes).
        *v = unsafe { _mm512_loadu_si512(col.as_ptr().cast()) };
    }
    // SAFETY: AVX512F is present (the caller's contract).
    unsafe { transpose16(&mut r) };
    for (p, row) in r.iter().enumerate() {
        // SAFETY: `dst` holds 16 rows of 16 dwords.
        unsafe { _mm512_storeu_si512(dst[p * PANEL..][..16].as_mut_ptr().cast(), *row) };
    }
}

/// Columns `c0 .. c0 + 16` of B (k × n) into `dst`: pair p, column c at `p·16 + c`, zero past
/// k and past n.
fn pack_b(b: Strided, k: usize, n: usize, c0: usize, dst: &mut [u32]) {
    let cols = PANEL.min(n.saturating_sub(c0));
    let full = k / 2;
    // Only the padding needs zeros: the pairs past k, and a ragged panel's missing columns.
    if cols < PANEL {
        dst.fill(0);
    } else {
        dst[full * PANEL..].fill(0);
    }
    if cols == 0 {
        return;
    }
    if b.cs == 1 {
        // Row-major: two rows' 16 columns interleave into one run of pairs (one vector for a
        // whole panel).
        for p in 0..full {
            let lo = &b.data[b.off + 2 * p * b.rs + c0..][..cols];
            let hi = &b.data[b.off + (2 * p + 1) * b.rs + c0..][..cols];
            if cols == PANEL {
                // SAFETY: AVX512F is present (`supported`); both rows hold 16 values and the
                // panel's pair row 16 dwords.
                unsafe {
                    let v = pairs16(lo, hi);
                    std::arch::x86_64::_mm512_storeu_si512(dst[p * PANEL..].as_mut_ptr().cast(), v);
                }
            } else {
                for (c, (&l, &h)) in lo.iter().zip(hi).enumerate() {
                    dst[p * PANEL + c] = pair(l, h);
                }
            }
        }
    } else if b.rs == 1 {
        // Transposed: each column's k is contiguous, already in pair order; whole 16-pair ×
        // 16-column squares are transposed in registers, the rest pair by pair.
        let squares = if cols == PANEL { full / 16 } else { 0 };
        for q in 0..squares {
            // SAFETY: AVX512F is present; each column holds pairs 16q .. 16q + 16 (k ≥ 32q +
            // 32), and dst holds those 16 pair rows of 16 dwords.
            unsafe { transposed_b_square(b, c0, 16 * q, &mut dst[16 * q * PANEL..][..16 * PANEL]) };
        }
        for c in 0..cols {
            let col = &b.data[b.off + (c0 + c) * b.cs..][..2 * full];
            for (p, two) in col.chunks_exact(2).enumerate().skip(16 * squares) {
                dst[p * PANEL + c] = pair(two[0], two[1]);
            }
        }
    } else {
        for p in 0..full {
            for c in 0..cols {
                dst[p * PANEL + c] = pair(b.at(2 * p, c0 + c), b.at(2 * p + 1, c0 + c));
            }
        }
    }
    if k % 2 == 1 {
        for c in 0..cols {
            dst[full * PANEL + c] = pair(b.at(k - 1, c0 + c), 0);
        }
    }
}
