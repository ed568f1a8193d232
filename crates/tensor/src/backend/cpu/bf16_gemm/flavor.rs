//! The packed bf16 GEMMs that share one driver (`driver`): what differs between them is the element
//! types, how many k one packed dword holds, the packers and the micro-kernel.
//!
//! - [`Native`]: bf16 operands packed in k-pairs for `VDPBF16PS` (`pack`, `kernel`).
//! - [`FmaBf16`]: bf16 operands widened to f32 while packing (exactly: a bf16 is the high half
//!   of an f32) and multiplied by f32 FMA (`fma_pack`, `fma_kernel`); the product of two bf16
//!   is exact in f32, so this sums the same exact products as `Native`, at the FMA rate. It is
//!   the bf16 kernel of Intel Xeons without usable AMX, whose `VDPBF16PS` issues at half the
//!   FMA rate (`docs/benchmarks.md`).
//!
//! Not for: the task grid, scratch or batches (`driver`, the parent module).

use super::kernel::{Sliver, Store};
use super::pack::Strided;
use super::{fma_kernel, fma_pack, kernel, pack};
use std::ops::Range;

/// One packed GEMM the driver runs.
pub(super) trait Flavor {
    /// k per packed dword: 2 for bf16 pairs, 1 for f32.
    const DEPTH: usize;
    /// The names of the packed operands' `temporary` scratch.
    const SCRATCH: [&'static str; 2];
    /// Whether the kernel reads a row-major A of even k in place (two consecutive bf16 of a row
    /// are a packed unit) instead of from a packed copy.
    const A_IN_PLACE: bool;
    /// Whether this CPU has the instructions the packers and kernel use.
    fn supported() -> bool;
    /// Packs units `us` of consecutive slivers of `a` (m × k), the first being sliver `s0`,
    /// into `dst`: one `us.len()·MR`-dword run per sliver, as many slivers as `dst` holds.
    ///
    /// # Safety
    /// [`Flavor::supported`] holds.
    unsafe fn pack_a(a: Strided, m: usize, k: usize, s0: usize, us: Range<usize>, dst: &mut [u32]);
    /// Packs units `us` of consecutive panels of `b` (k × n), the first being panel `j0`, into
    /// `dst`: one `us.len()·NR`-dword run per panel, as many panels as `dst` holds.
    ///
    /// # Safety
    /// [`Flavor::supported`] holds.
    unsafe fn pack_b(b: Strided, k: usize, n: usize, j0: usize, us: Range<usize>, dst: &mut [u32]);
    /// `C[6×64] (+)= Σ A[u]·B[u]` over `units` packed units; `a` is a packed sliver unless
    /// [`Flavor::A_IN_PLACE`].
    ///
    /// # Safety
    /// [`Flavor::supported`] holds, and the pointers satisfy the contract of
    /// `kernel::tile_6x64` (with units in place of pairs).
    unsafe fn tile(units: usize, a: Sliver, b: *const u32, load: Option<*const f32>, store: Store);
}

/// bf16 pairs on `VDPBF16PS`.
pub(super) struct Native;
/// bf16 widened while packing, multiplied by f32 FMA.
pub(super) struct FmaBf16;

impl Flavor for Native {
    const DEPTH: usize = 2;
    const A_IN_PLACE: bool = true;
    const SCRATCH: [&'static str; 2] = ["matmul.bf16.packed_lhs", "matmul.bf16.packed_rhs"];
    fn supported() -> bool {
        super::native_supported()
    }
    unsafe fn pack_a(a: Strided, m: usize, k: usize, s0: usize, us: Range<usize>, d: &mut [u32]) {
        // SAFETY: the caller guarantees AVX512F/BW (part of `native_supported`).
        unsafe { pack::pack_a(a, m, k, s0, us, d) }
    }
    unsafe fn pack_b(b: Strided, k: usize, n: usize, j0: usize, us: Range<usize>, d: &mut [u32]) {
        // SAFETY: as for `pack_a`.
        unsafe { pack::pack_b(b, k, n, j0, us, d) }
    }
    unsafe fn tile(u: usize, a: Sliver, b: *const u32, l: Option<*const f32>, s: Store) {
        // SAFETY: forwarded contract.
        unsafe { kernel::tile_6x64(u, a, b, l, s) }
    }
}

impl Flavor for FmaBf16 {
    const DEPTH: usize = 1;
    const A_IN_PLACE: bool = false;
    const SCRATCH: [&'static str; 2] = ["matmul.bf16.f32_packed_lhs", "matmul.bf16.f32_packed_rhs"];
    fn supported() -> bool {
        super::fma_supported()
    }
    unsafe fn pack_a(a: Strided, m: usize, k: usize, s0: usize, us: Range<usize>, d: &mut [u32]) {
        // SAFETY: the caller guarantees AVX512F (part of `fma_supported`).
        unsafe { fma_pack::pack_a(a, m, k, s0, us, d) }
    }
    unsafe fn pack_b(b: Strided, k: usize, n: usize, j0: usize, us: Range<usize>, d: &mut [u32]) {
        // SAFETY: as for `pack_a`.
        unsafe { fma_pack::pack_b(b, k, n, j0, us, d) }
    }
    unsafe fn tile(u: usize, a: Sliver, b: *const u32, l: Option<*const f32>, s: Store) {
        // A_IN_PLACE is false: the driver always hands this flavor a packed sliver.
        debug_assert!(a.packed_start().is_some(), "the FMA flavor reads A packed");
        let a = a.rows[0].cast::<u32>();
        // SAFETY: forwarded contract.
        unsafe { fma_kernel::tile_bf16(u, a, b, l, s) }
    }
}
