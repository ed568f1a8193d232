//! The native bf16 GEMM: bf16 × bf16 products accumulated in f32 by `VDPBF16PS`
//! (AVX512_BF16, Intel's intrinsics guide: `_mm512_dpbf16_ps`), rounded once to bf16 on store.
//! On CPUs with the instruction (AMD Zen 4 and Zen 5, Intel Cooper Lake and later Xeons) it
//! does two bf16 multiply-adds per f32 lane per instruction, twice the f32 FMA rate on AMD's
//! cores, where widening to f32 (the fallback in `matmul.rs`) is capped at the f32 rate.
//!
//! How one product `C (m × n) = A (m × k) · B (k × n)` runs (BLIS-style, Van Zee & van de
//! Geijn, "BLIS: A Framework for Rapidly Instantiating BLAS Functionality", 2015):
//! 1. Pack both operands once into k-pair dwords (`pack`): A in 6-row slivers, B in 64-column
//!    panels, both stored k block by k block, from whatever strides the caller's layouts have
//!    (a transposed operand is packed from its own strides, no copy first). The packed copies
//!    live in `temporary` scratch from the device allocator. A row-major A (unit column
//!    stride) of even k is not packed: two consecutive bf16 of a row are already the k-pair
//!    the kernel broadcasts, so the kernel reads its slivers where they lie (`kernel::Sliver`;
//!    measured +10 % on the GPT's forward and input-gradient shapes, `docs/benchmarks.md`).
//! 2. Split C into tasks of consecutive slivers × a range of panels, run in parallel with
//!    rayon (`driver`). A task walks its panels; for each it walks k in blocks of about 256
//!    so that the block of the B panel (32 KiB) stays in L1 while every sliver of the task
//!    reuses it (`kernel::tile_6x64`). Sums of earlier k blocks wait in a per-task f32 tile on
//!    the stack (at most 64 slivers · 6 · 64 · 4 bytes = 96 KiB, fixed, like a register spill).
//! 3. The last k block rounds each f32 sum once to bf16 (round-to-nearest-even) into C.
//!
//! Deterministic: k is never split across threads. Every element of C is one f32 accumulator
//! that adds the k-pairs in order, block after block, so the bits do not depend on the thread
//! count or on how C is cut into tasks (only on k, through the fixed block size).
//!
//! Numerics against the widening path: both sum exact bf16 products in f32, so both satisfy
//! `|c − c_exact| ≤ γ_k·Σ|a_i·b_i|` before the bf16 rounding, but in different orders, so their
//! bits differ. `VDPBF16PS` also treats bf16 subnormal inputs as zero and flushes subnormal
//! sums, and `VCVTNEPS2BF16` flushes subnormal results (Intel SDM); the widening path keeps
//! them. Neither matters at training magnitudes. Sources: `docs/sources.md` §17.
//!
//! The same driver runs a second flavor (`flavor`, `Bf16Gemm::Fma`) that widens the bf16
//! operands to f32 while packing (`fma_pack`) and multiplies with f32 FMA (`fma_kernel`): the
//! same exact products, summed in f32, at the FMA rate.
//!
//! Which bf16 kernel runs: the CPU is checked once. Where it has AMX-BF16 tiles (Intel Xeons
//! from Sapphire Rapids on) the `amx` kernel runs; else, on AMD CPUs with AVX512_BF16 (whose
//! `VDPBF16PS` issues at twice the FMA rate), this one; else, with AVX-512, the FMA flavor
//! (Intel's `VDPBF16PS` issues at half the FMA rate, measured in `docs/benchmarks.md`); else
//! the widening fallback. `HEADROOM_BF16_GEMM=amx`, `=native`, `=fma` or `=widening` in the
//! environment, or [`set_bf16_gemm`], selects another the CPU runs.
//!
//! Not for: f32 or f16 products (gemm), shape checks or batch broadcasting (the ops
//! layer), fused epilogues (bias, activation) or a k-split for tall-skinny products.

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
mod amx_pack;
#[cfg(target_arch = "x86_64")]
mod amx_store;
#[cfg(target_arch = "x86_64")]
mod amx_tiles;
#[cfg(target_arch = "x86_64")]
mod driver;
#[cfg(target_arch = "x86_64")]
mod flavor;
#[cfg(target_arch = "x86_64")]
mod fma_kernel;
#[cfg(target_arch = "x86_64")]
mod fma_pack;
#[cfg(target_arch = "x86_64")]
mod kernel;
#[cfg(target_arch = "x86_64")]
mod pack;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests;

use super::matmul::Dims;
use super::{Scratch, scratch_f32};
use crate::error::Result;
use crate::shape::Layout;
use half::bf16;
use headroom_memory::Device;
use std::sync::atomic::{AtomicU8, Ordering};

/// Rows of C per micro-tile (one broadcast A pair each).
const MR: usize = 6;
/// Columns of C per micro-tile (four zmm of 16 f32 lanes).
const NR: usize = 64;

/// Below this many multiply-adds one product runs on one thread and batch elements run in
/// parallel instead (the widening path's threshold too).
const SMALL: usize = 96 * 96 * 96;
/// The AMX kernel's batch threshold: its products run about five times faster than the native
/// kernel's, so a product of attention's per-head shape (256 × 64 · 64 × 256, 4.2 M
/// multiply-adds, about 10 µs on one core) costs little more than splitting it across threads
/// would; below this many multiply-adds batch elements run in parallel instead.
#[cfg(target_arch = "x86_64")]
const AMX_SMALL: usize = 256 * 256 * 256;
/// Batch elements packed at once when small products run in parallel across the batch.
const BATCH_SLOTS: usize = 8;

/// The kernel the CPU backend multiplies bf16 matrices with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Gemm {
    /// `TDPBF16PS` on AMX tiles (`amx`); needs AMX-TILE, AMX-BF16 and the OS's permission.
    Amx,
    /// `VDPBF16PS` on packed bf16 pairs (this module); needs AVX512F/BW/VL and AVX512_BF16.
    Native,
    /// bf16 widened to f32 while packing, f32 FMA (`fma_kernel`); needs AVX512F/BW/VL.
    Fma,
    /// Widen tiles to f32 and call gemm's f32 kernels (`matmul.rs`); runs on any CPU.
    Widening,
}

const UNDECIDED: u8 = 0;
const NATIVE: u8 = 1;
const WIDENING: u8 = 2;
const AMX: u8 = 3;
const FMA: u8 = 4;
static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// Whether this CPU has the instructions the native kernel needs.
pub fn native_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        fma_supported() && std::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has the instructions of the FMA flavor (bf16 packed to f32): AVX512F, BW
/// and VL, which the native kernel needs too.
pub fn fma_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether `VDPBF16PS` issues at least at the f32 FMA rate here, so the native kernel beats
/// the FMA flavor: AMD's Zen 4 and Zen 5 (two bf16 products per lane per FMA slot). Intel
/// cores issue it at half the FMA rate (measured: `docs/benchmarks.md`).
fn native_is_fast() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        // "AuthenticAMD" in EBX, EDX, ECX.
        (id.ebx, id.edx, id.ecx) == (0x6874_7541, 0x6974_6E65, 0x444D_4163)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU and OS run the AMX kernel.
pub fn amx_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::supported()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The kernel in use: the fastest this CPU runs (AMX; then `VDPBF16PS` on AMD, the FMA flavor
/// elsewhere; then widening), unless `HEADROOM_BF16_GEMM` in the environment, or
/// [`set_bf16_gemm`], chose another.
pub fn bf16_gemm() -> Bf16Gemm {
    match CHOICE.load(Ordering::Relaxed) {
        AMX => Bf16Gemm::Amx,
        NATIVE => Bf16Gemm::Native,
        FMA => Bf16Gemm::Fma,
        WIDENING => Bf16Gemm::Widening,
        _ => {
            let forced = std::env::var("HEADROOM_BF16_GEMM");
            set_bf16_gemm(match forced.as_deref() {
                Ok("widening") => Bf16Gemm::Widening,
                Ok("native") => Bf16Gemm::Native,
                Ok("fma") => Bf16Gemm::Fma,
                Ok("amx") => Bf16Gemm::Amx,
                Ok("") | Err(_) => default_bf16_gemm(),
                Ok(other) => {
                    // A benchmarking switch: a typo must not pass for a measured choice.
                    eprintln!(
                        "warning: HEADROOM_BF16_GEMM={other:?} is not one of amx, native, fma, \
                         widening; using this CPU's default bf16 kernel"
                    );
                    default_bf16_gemm()
                }
            })
        }
    }
}

/// The fastest kernel this CPU runs: AMX, then `VDPBF16PS` on AMD, then the FMA flavor
/// (`set_bf16_gemm` falls back further to widening on CPUs without AVX-512).
fn default_bf16_gemm() -> Bf16Gemm {
    if amx_supported() {
        Bf16Gemm::Amx
    } else if native_supported() && native_is_fast() {
        Bf16Gemm::Native
    } else {
        Bf16Gemm::Fma
    }
}

/// Selects the kernel for the whole process (benchmarks and A/B runs; tests that run in
/// parallel should call the kernels directly instead). A kernel the CPU cannot run falls back
/// to the next (AMX to `Native` to `Fma` to `Widening`); returns the kernel now in use.
pub fn set_bf16_gemm(kernel: Bf16Gemm) -> Bf16Gemm {
    let chosen = match kernel {
        Bf16Gemm::Amx if amx_supported() => Bf16Gemm::Amx,
        Bf16Gemm::Amx | Bf16Gemm::Native if native_supported() => Bf16Gemm::Native,
        Bf16Gemm::Amx | Bf16Gemm::Native | Bf16Gemm::Fma if fma_supported() => Bf16Gemm::Fma,
        _ => Bf16Gemm::Widening,
    };
    let code = match chosen {
        Bf16Gemm::Amx => AMX,
        Bf16Gemm::Native => NATIVE,
        Bf16Gemm::Fma => FMA,
        Bf16Gemm::Widening => WIDENING,
    };
    CHOICE.store(code, Ordering::Relaxed);
    chosen
}

/// Sizes of one product's packed operands, in dwords (one unit each: a k-pair of bf16, or
/// one k of f32).
#[derive(Debug, Clone, Copy)]
struct Packed {
    units: usize,
    slivers: usize,
    panels: usize,
}

impl Packed {
    /// For a flavor packing `depth` k per dword.
    fn of(d: &Dims, depth: usize) -> Packed {
        Packed {
            units: d.k.div_ceil(depth),
            slivers: d.m.div_ceil(MR),
            panels: d.n.div_ceil(NR),
        }
    }
    fn a_words(&self) -> usize {
        self.slivers * self.units * MR
    }
    fn b_words(&self) -> usize {
        self.panels * self.units * NR
    }
}

/// Runs `product` on every batch element of `out (batch, m, n) = a @ b` (bf16 bits, batch
/// layouts `la`, `lb`): the element's operand views, its slice of C and of the packed scratch
/// (`words` dwords of A and of B per element). Products of a batch below `batch_small`
/// multiply-adds run [`slots`] elements at a time in parallel, each on one thread; larger ones
/// one after another, each told (the last argument of `product`) to run in parallel inside
/// unless it is below [`SMALL`]. Shared by the packed and AMX kernels.
#[cfg(target_arch = "x86_64")]
fn for_each_product(
    (a, la): (&[u16], &Layout),
    (b, lb): (&[u16], &Layout),
    out: &mut [u16],
    (d, batch_small): (&Dims, usize),
    (pa, pb): (&mut [u32], &mut [u32]),
    (a_words, b_words): (usize, usize),
    product: impl Fn(pack::Strided, pack::Strided, &mut [u16], &mut [u32], &mut [u32], bool) + Sync,
) {
    use rayon::prelude::*;
    let (ba, ars, acs) = super::matmul::split(la);
    let (bb, brs, bcs) = super::matmul::split(lb);
    let view = |data, off, rs: isize, cs: isize| pack::Strided {
        data,
        off,
        rs: rs as usize,
        cs: cs as usize,
    };
    let slots = slots(d, batch_small);
    let parallel_inside = slots == 1 && !small(d);
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
                &mut pa[..a_words],
                &mut pb[..b_words],
                parallel_inside,
            );
        };
        if count == 1 {
            one(0, out_chunk, pa, pb);
        } else {
            out_chunk
                .par_chunks_mut(d.m * d.n)
                .zip(pa.par_chunks_mut(a_words))
                .zip(pb.par_chunks_mut(b_words))
                .enumerate()
                .for_each(|(i, ((o, pa), pb))| one(i, o, pa, pb));
        }
        first += count;
    }
}

fn small(d: &Dims) -> bool {
    d.m * d.n * d.k < SMALL
}

/// Batch elements packed (and computed) at once when batch elements below `batch_small`
/// multiply-adds run in parallel.
fn slots(d: &Dims, batch_small: usize) -> usize {
    if d.batch > 1 && d.m * d.n * d.k < batch_small {
        d.batch.min(BATCH_SLOTS)
    } else {
        1
    }
}

/// The `temporary` scratch of a packed flavor: the packed left and right operands of
/// `slots(d)` batch elements. It depends on the dims only, so the shape-only backend's dry runs
/// allocate exactly these bytes.
#[cfg(target_arch = "x86_64")]
fn scratch<F: flavor::Flavor>(device: &Device, d: Dims) -> Result<[Scratch; 2]> {
    let (p, s) = (Packed::of(&d, F::DEPTH), slots(&d, SMALL));
    Ok([
        scratch_f32(device, s * p.a_words(), F::SCRATCH[0])?,
        scratch_f32(device, s * p.b_words(), F::SCRATCH[1])?,
    ])
}

/// The scratch of [`native`].
#[cfg(target_arch = "x86_64")]
pub(crate) fn native_scratch(device: &Device, d: Dims) -> Result<[Scratch; 2]> {
    scratch::<flavor::Native>(device, d)
}

/// The scratch of [`fma_bf16`].
#[cfg(target_arch = "x86_64")]
pub(crate) fn fma_bf16_scratch(device: &Device, d: Dims) -> Result<[Scratch; 2]> {
    scratch::<flavor::FmaBf16>(device, d)
}

/// bf16 `out (batch, m, n) = a @ b` on `VDPBF16PS`.
///
/// # Panics
/// When [`native_supported`] is false.
#[cfg(target_arch = "x86_64")]
pub(crate) fn native(
    device: &Device,
    a: (&[bf16], &Layout),
    b: (&[bf16], &Layout),
    out: &mut [bf16],
    d: Dims,
) -> Result<()> {
    driver::matmul::<flavor::Native>(device, a, b, out, d)
}

/// bf16 `out (batch, m, n) = a @ b`, widened while packing and multiplied by f32 FMA.
///
/// # Panics
/// When [`fma_supported`] is false.
#[cfg(target_arch = "x86_64")]
pub(crate) fn fma_bf16(
    device: &Device,
    a: (&[bf16], &Layout),
    b: (&[bf16], &Layout),
    out: &mut [bf16],
    d: Dims,
) -> Result<()> {
    driver::matmul::<flavor::FmaBf16>(device, a, b, out, d)
}
