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
//! How one product `C (m × n) = A (m × k) · B (k × n)` runs, slab by slab of k (512 of k at
//! most, so that a slab of packed B stays in L2 while every row block streams it):
//! 1. B's slab is packed into panels of 16 columns: within panel j, k-pair p holds the 16
//!    columns' pairs `(B[2p][c], B[2p+1][c])` as dwords, so 16 consecutive pairs are one B tile
//!    (16 rows of 64 bytes, contiguous). k is padded with zero pairs to a multiple of 32 and n
//!    with zero columns to a multiple of 32.
//! 2. C is cut into blocks of 32 rows, one task each (rayon). A row-major A whose slab is whole
//!    tiles (k contiguous, a multiple of 32, 32 rows) is read by the tile loads in place; any
//!    other block of A is packed row-major with the same zero padding (each row's k
//!    contiguous: 16 pairs are one A tile row). For every 32 columns of C the task keeps four
//!    C tiles (2 × 2) over the slab's k, loading two A and two B tiles per 32 of k, starting
//!    from zero or from the f32 sums the earlier slabs left, and stores them.
//! 3. After the last slab the f32 sums are rounded once to bf16 (round-to-nearest-even,
//!    `VCVTNEPS2BF16`) into C; a linear layer's bias is added then, as a separate add op
//!    would add it (the rounded product widened, the bias added in f32, rounded again).
//!
//! Products of a batch below 256³ multiply-adds (attention's per-head products) run batch
//! elements in parallel, one thread each, instead of splitting each small product.
//!
//! Deterministic: each element of C is one tile accumulator over all of k, in order, on one
//! thread (between slabs its f32 value is stored and reloaded exactly), so the bits depend
//! neither on the thread count nor on the slab size. `TDPBF16PS` treats subnormal inputs and
//! outputs as zero, like `VDPBF16PS`.
//!
//! Layout: this file (support, driver), `amx_tiles` (the tile instructions), `amx_pack` (the
//! tile layouts), `amx_store` (rounding the sums into C, with a bias).
//!
//! Not for: CPUs without AMX (the `VDPBF16PS` kernel, then widening), shape checks or batches'
//! broadcasting (the ops layer).

use super::amx_pack::{pack_a_rows, pack_b};
use super::amx_store::round_row;
use super::amx_tiles::{TileConfig, tiles_2x2};
use super::pack::Strided;
use super::{AMX_SMALL, for_each_product, slots};
use crate::backend::cpu::Scratch;
use crate::backend::cpu::matmul::Dims;
use crate::error::Result;
use crate::shape::Layout;
use half::bf16;
use headroom_memory::Device;
use rayon::prelude::*;
use std::sync::OnceLock;

/// Rows (and columns) of C per task block: 2 × 2 tiles of 16.
pub(super) const BLOCK: usize = 32;
/// Columns of a packed B panel (one tile's width).
pub(super) const PANEL: usize = 16;
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

/// k-pairs per slab (512 of k). A deeper k is split into slabs so that one slab of packed B
/// (`SLAB_PAIRS` × the padded n, 1.2 MiB at n = 1152) stays in L2 while every row block of the
/// slab streams it, instead of every row block streaming all of B from memory.
const SLAB_PAIRS: usize = 256;

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
    /// k-pairs of the first (widest) slab.
    fn slab_pairs(&self) -> usize {
        self.pairs.min(SLAB_PAIRS)
    }
    fn slabs(&self) -> usize {
        self.pairs.div_ceil(SLAB_PAIRS)
    }
    /// Packed A of one slab.
    fn a_words(&self) -> usize {
        self.rows * self.slab_pairs()
    }
    /// Packed B of one slab, then (when k has several slabs) the f32 sums of C that wait
    /// between slabs.
    fn b_words(&self) -> usize {
        let sums = if self.slabs() > 1 {
            self.rows * self.cols
        } else {
            0
        };
        self.cols * self.slab_pairs() + sums
    }
}

/// The `temporary` scratch of the AMX kernel for `slots` batch elements: packed A of one slab,
/// and packed B of one slab followed by C's f32 sums when k spans several slabs. It depends on
/// the dims only, so the shape-only backend's dry runs allocate exactly these bytes.
pub(crate) fn scratch(device: &Device, d: Dims) -> Result<[Scratch; 2]> {
    let (p, s) = (Padded::of(&d), slots(&d, AMX_SMALL));
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
    run(device, (a, la), (b, lb), None, out, d)
}

/// bf16 `out (batch, m, n) = a @ b + bias`, `bias` (n values) added to every row of every
/// product as the separate add op would: the rounded product widened, the bias added in f32,
/// the sum rounded to bf16 again (`round_row`), so the bits are those of matmul then add.
///
/// # Panics
/// When [`supported`] is false, `bias` does not hold n values, or k is 0 (the backend adds a
/// bias to an empty product without this kernel).
pub(crate) fn matmul_bias(
    device: &Device,
    (a, la): (&[bf16], &Layout),
    (b, lb): (&[bf16], &Layout),
    bias: &[bf16],
    out: &mut [bf16],
    d: Dims,
) -> Result<()> {
    assert_eq!(bias.len(), d.n, "one bias value per column");
    assert!(d.k > 0, "an empty product's bias is added by the backend");
    run(device, (a, la), (b, lb), Some(bias), out, d)
}

fn run(
    device: &Device,
    (a, la): (&[bf16], &Layout),
    (b, lb): (&[bf16], &Layout),
    bias: Option<&[bf16]>,
    out: &mut [bf16],
    d: Dims,
) -> Result<()> {
    assert!(
        supported(),
        "the AMX bf16 GEMM needs AMX-BF16 and the OS's permission"
    );
    let p = Padded::of(&d);
    // Held as the array, so the left buffer is freed before the right one: the order a dry run
    // frees them in. The cache's state after the free, and so later peaks, depend on it.
    let mut scratch = scratch(device, d)?;
    let [sa, sb] = &mut scratch;
    for_each_product(
        (bytemuck::cast_slice(a), la),
        (bytemuck::cast_slice(b), lb),
        bytemuck::cast_slice_mut(out),
        (&d, AMX_SMALL),
        (
            bytemuck::cast_slice_mut(sa.slice_mut()),
            bytemuck::cast_slice_mut(sb.slice_mut()),
        ),
        (p.a_words(), p.b_words()),
        |av, bv, o, pa, pb, parallel| {
            let bias = bias.map(bytemuck::cast_slice::<bf16, u16>);
            product((av, bv, bias), o, pa, pb, &d, parallel)
        },
    );
    Ok(())
}

/// A raw pointer to C that tasks share: each writes only its own block of rows.
#[derive(Debug, Clone, Copy)]
struct OutPtr(*mut u16);
// SAFETY: tasks write disjoint row blocks of C through it (see `product`), and C outlives them.
unsafe impl Send for OutPtr {}
// SAFETY: as above; no task reads C.
unsafe impl Sync for OutPtr {}

/// One slab of k: its operand views (shifted to the slab's first k), its k and padded k-pairs,
/// and where its sums start and end.
#[derive(Debug, Clone, Copy)]
struct Slab<'a> {
    a: Strided<'a>,
    b: Strided<'a>,
    /// The bias bits (n values) the last slab adds while rounding, if any.
    bias: Option<&'a [u16]>,
    k: usize,
    pairs: usize,
    /// The first slab starts C's tiles at zero; later ones reload the sums of earlier slabs.
    first: bool,
    /// The last slab rounds the sums into C; earlier ones store them as f32.
    last: bool,
}

/// One product, slab by slab of k: B's slab packed (in parallel over panels), then one task per
/// 32 rows of C, each packing its rows of A's slab (or reading them in place) and running the
/// tiles.
fn product(
    (a, b, bias): (Strided, Strided, Option<&[u16]>),
    out: &mut [u16],
    pa: &mut [u32],
    pb: &mut [u32],
    d: &Dims,
    parallel: bool,
) {
    let p = Padded::of(d);
    if p.pairs == 0 {
        // k = 0: every sum is empty (`matmul_bias` takes no such product).
        out.fill(0);
        return;
    }
    let (pb, sums) = pb.split_at_mut(p.cols * p.slab_pairs());
    let sums: &mut [f32] = bytemuck::cast_slice_mut(sums);
    let c = OutPtr(out.as_mut_ptr());
    let slabs = p.slabs();
    for s in 0..slabs {
        let kp0 = s * SLAB_PAIRS;
        let pairs = SLAB_PAIRS.min(p.pairs - kp0);
        let k0 = 2 * kp0;
        let slab = Slab {
            a: Strided {
                off: a.off + k0 * a.cs,
                ..a
            },
            b: Strided {
                off: b.off + k0 * b.rs,
                ..b
            },
            bias,
            k: (d.k - k0).min(2 * pairs),
            pairs,
            first: s == 0,
            last: s + 1 == slabs,
        };
        let pb = &mut pb[..p.cols * pairs];
        let pa = &mut pa[..p.rows * pairs];
        // One task per item in parallel, or all on this thread (a minimum length no split
        // reaches).
        let min = if parallel { 1 } else { usize::MAX };
        pb.par_chunks_mut(pairs * PANEL)
            .with_min_len(min)
            .enumerate()
            .for_each(|(j, dst)| pack_b(slab.b, slab.k, d.n, j * PANEL, dst));
        let pb: &[u32] = pb;
        let blocks = pa
            .par_chunks_mut(BLOCK * pairs)
            .with_min_len(min)
            .enumerate();
        if slabs > 1 {
            blocks
                .zip(sums.par_chunks_mut(BLOCK * p.cols))
                .for_each(|((r, blk), acc)| row_block(slab, r, blk, pb, Some(acc), c, d));
        } else {
            blocks.for_each(|(r, blk)| row_block(slab, r, blk, pb, None, c, d));
        }
    }
}

/// Task `r` of one slab: rows `32·r ..` of C. Reads those rows of A's slab in place when they
/// are whole tiles of a row-major A (32 rows, k contiguous, no padding), else packs them into
/// `pa` (32 rows of `slab.pairs` dwords); then runs every 32-column block of C over the slab's
/// k on the tiles. The 32 × 32 sums of a block start at zero (first slab) or come from `acc`
/// (this task's `32 × cols` f32, block by block), and go back there or, after the last slab,
/// are rounded into C.
fn row_block(
    slab: Slab,
    r: usize,
    pa: &mut [u32],
    pb: &[u32],
    mut acc: Option<&mut [f32]>,
    c: OutPtr,
    d: &Dims,
) {
    let p = Padded::of(d);
    let r0 = r * BLOCK;
    let rows = BLOCK.min(d.m - r0);
    let a = slab.a;
    let (a_ptr, a_stride) = if a.cs == 1 && rows == BLOCK && slab.k == 2 * slab.pairs {
        // The 32 rows' slabs of k, bounds-checked once: tile row i of step t reads 64 bytes at
        // `(r0 + i)·rs + 32·t`, inside this range.
        let rows_k = &a.data[a.off + r0 * a.rs..a.off + (r0 + BLOCK - 1) * a.rs + slab.k];
        (rows_k.as_ptr().cast::<u8>(), 2 * a.rs)
    } else {
        pack_a_rows(a, d.m, slab.k, r0, slab.pairs, pa);
        (pa.as_ptr().cast::<u8>(), 4 * slab.pairs)
    };
    let mut local = [0f32; BLOCK * BLOCK];
    let tiles = slab.pairs / TILE_PAIRS;
    let _config = TileConfig::load();
    for cb in 0..p.cols / BLOCK {
        let b0 = &pb[2 * cb * slab.pairs * PANEL..][..2 * slab.pairs * PANEL];
        let sums: &mut [f32; BLOCK * BLOCK] = match acc.as_deref_mut() {
            Some(acc) => (&mut acc[cb * BLOCK * BLOCK..][..BLOCK * BLOCK])
                .try_into()
                .expect("one 32 × 32 block"),
            None => &mut local,
        };
        // SAFETY: the tile configuration is loaded (`_config`); the A rows hold 32 rows of
        // `tiles · 16` dwords at `a_stride` bytes (checked above, or the packed block), and the
        // two B panels `pairs` × 16 dwords each, so every tile load of the `tiles` steps stays
        // inside them; `sums` holds 32 × 32 f32 for the loads and stores.
        unsafe {
            tiles_2x2(
                a_ptr,
                a_stride,
                b0.as_ptr(),
                slab.pairs,
                tiles,
                !slab.first,
                sums,
            )
        };
        if !slab.last {
            continue;
        }
        let c0 = cb * BLOCK;
        let cols = BLOCK.min(d.n - c0);
        // The block's 32 bias values widened once (`Elem::to_f32`, a NaN made quiet), zero
        // past n.
        let bias = slab.bias.map(|b| {
            let mut w = [0f32; BLOCK];
            for (o, &v) in w.iter_mut().zip(&b[c0..c0 + cols]) {
                *o = <bf16 as crate::dtype::Elem>::to_f32(bf16::from_bits(v));
            }
            w
        });
        for (i, row) in sums.chunks_exact(BLOCK).take(rows).enumerate() {
            // SAFETY: AVX512F/BW/VL and AVX512_BF16 are present (`supported`); row r0 + i < m
            // and columns c0 .. c0 + cols ≤ n lie inside the m × n C, and only this task writes
            // rows r0 .. r0 + 32.
            unsafe { round_row(row, c.0.add((r0 + i) * d.n + c0), cols, bias.as_ref()) };
        }
    }
}
