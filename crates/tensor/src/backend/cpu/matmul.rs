//! Batched matrix multiply on the `gemm` crate. f32 calls gemm directly with the operands' own
//! strides (a transposed weight costs no copy). bf16 runs on the packed kernels of `bf16_gemm`
//! (AMX tiles, `VDPBF16PS`, or f32 FMA on packed copies, whichever is fastest here) where the
//! CPU has AVX-512. Otherwise bf16, and f16 always, are widened to f32 in tiles around gemm's
//! f32 kernel: the right operand once per batch element, the left operand and the output in
//! panels of `TILE_M` rows, all in `temporary` scratch from the device allocator (gemm's own
//! f16 kernel was slower than this on CPUs without AVX512-FP16: `docs/benchmarks.md`). Small
//! batched products (attention's per-head products) run their batch elements in parallel, each
//! with its own tiles. Products accumulate in f32. Neither gemm nor the packed kernels split the
//! k dimension across threads, so results are deterministic.
//!
//! Not for: shape checks or batch broadcasting (the ops layer hands in matching batch dims).

use super::bf16_gemm::{self, Bf16Gemm};
use super::simd::wide;
use super::{Scratch, scratch_f32};
use crate::dtype::Elem;
use crate::error::Result;
use crate::shape::Layout;
use gemm::Parallelism;
use half::bf16;
use headroom_memory::Device;
use rayon::prelude::*;
use std::sync::Mutex;

/// Rows of the left operand widened at a time on the bf16 path.
const TILE_M: usize = 512;
/// Below this many multiply-adds a single product runs on one thread, and batches run in
/// parallel instead.
const SMALL: usize = 96 * 96 * 96;
/// An f32 batch of at least this many products per thread runs its products side by side, each
/// on one thread, whatever their size: attention's per-head products (256×64·64×256 for a GPT
/// of 64-feature heads) split over the pool one after the other spend more on the split than on
/// the product (80–120 GFLOP/s against 190–240 side by side on two AVX-512 cores; the
/// `attention_f32` bench of `benches/matmul.rs`). gemm's result does not depend on its threads.
const PRODUCTS_PER_THREAD: usize = 4;

/// Problem geometry shared by every batch element.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Dims {
    /// The geometry of `dst (…, M, N) = a (…, M, K) @ b`.
    pub(crate) fn of(a: &crate::backend::Src, dst: &crate::backend::Dst) -> Dims {
        let s = dst.layout.shape();
        let r = s.len();
        Dims {
            batch: crate::shape::numel(&s[..r - 2]),
            m: s[r - 2],
            n: s[r - 1],
            k: a.layout.shape()[r - 1],
        }
    }
}

/// The CPU backend's `Backend::matmul_bias`: the AMX kernel adds a contiguous bf16 bias in its
/// store; any other kernel (or bias layout) runs the product, then [`add_bias_rows`].
pub(super) fn matmul_bias(
    cpu: &super::CpuBackend,
    a: &crate::backend::Src,
    b: &crate::backend::Src,
    bias: &crate::backend::Src,
    dst: &mut crate::backend::Dst,
) -> Result<()> {
    use crate::backend::Backend;
    use crate::dtype::{DType, with_float_type};
    let d = Dims::of(a, dst);
    #[cfg(target_arch = "x86_64")]
    if a.dtype == DType::BF16
        && bias.dtype == DType::BF16
        && bias.layout.is_contiguous()
        && d.m * d.n * d.k > 0
        && bf16_gemm::bf16_gemm() == Bf16Gemm::Amx
    {
        let device = dst.buf.device().clone();
        return bf16_gemm::amx::matmul_bias(
            &device,
            (super::slice(a)?, a.layout),
            (super::slice(b)?, b.layout),
            super::rows_of(bias)?,
            super::slice_mut(dst)?,
            d,
        );
    }
    cpu.matmul(a, b, dst)?;
    let bias = cpu.download_f32(bias)?;
    let l = dst.layout.clone();
    with_float_type!(dst.dtype, T => {
        let out = super::slice_mut::<T>(dst)?;
        add_bias_rows(&mut out[l.offset()..l.offset() + l.numel()], &bias);
        Ok(())
    }, _ => Err(super::unsupported("matmul_bias", dst.dtype)))
}

/// `out[r·n + j] += bias[j]` for a row-major `out` of `bias.len()` columns, each sum rounded
/// as the add op rounds it (`T::from_f32(out + bias)`, the bias already widened), so a product
/// followed by this pass has the bits of matmul then add. Parallel over rows.
pub fn add_bias_rows<T: Elem>(out: &mut [T], bias: &[f32]) {
    let n = bias.len();
    if n == 0 {
        return;
    }
    let per = ((1 << 14) / n).max(1);
    out.par_chunks_mut(per * n).for_each(|rows| {
        wide(
            #[inline(always)]
            || {
                for row in rows.chunks_mut(n) {
                    for (o, &b) in row.iter_mut().zip(bias) {
                        *o = T::from_f32(o.to_f32() + b);
                    }
                }
            },
        )
    });
}

/// Batch layout (the leading dims) and the row and column strides of the matrix dims.
pub(super) fn split(l: &Layout) -> (Layout, isize, isize) {
    let r = l.rank();
    let batch = Layout::new(
        l.shape()[..r - 2].to_vec(),
        l.strides()[..r - 2].to_vec(),
        l.offset(),
    );
    (
        batch,
        l.strides()[r - 2] as isize,
        l.strides()[r - 1] as isize,
    )
}

fn parallelism(d: &Dims) -> Parallelism {
    if d.m * d.n * d.k < SMALL {
        Parallelism::None
    } else {
        Parallelism::Rayon(rayon::current_num_threads())
    }
}

/// Whether an f32 batch runs its products side by side, each on one thread: small products,
/// or enough of them to keep every thread busy.
fn side_by_side(d: &Dims) -> bool {
    d.batch > 1
        && (d.m * d.n * d.k < SMALL
            || d.batch >= PRODUCTS_PER_THREAD * rayon::current_num_threads())
}

/// f32 `out (batch, m, n) = a @ b` on gemm, with the operands' own strides.
pub fn matmul_f32(a: &[f32], la: &Layout, b: &[f32], lb: &Layout, out: &mut [f32], d: Dims) {
    let (ba, ars, acs) = split(la);
    let (bb, brs, bcs) = split(lb);
    let (ap, bp) = (a.as_ptr() as usize, b.as_ptr() as usize);
    for_each_product(out, &d, |i, o, par| {
        let (ao, bo) = (ba.index_of(i), bb.index_of(i));
        // SAFETY: `ao`/`bo` plus the matrix strides stay inside `a`/`b` because the layouts
        // were built by `Layout` from these storages' shapes; `o` is exactly m×n row-major.
        unsafe {
            gemm_f32(
                [d.m, d.n, d.k],
                (o.as_mut_ptr(), d.n),
                ((ap as *const f32).add(ao), ars, acs),
                ((bp as *const f32).add(bo), brs, bcs),
                par,
            )
        }
    });
}

/// Runs `one(i, out_i, parallelism)` for each batch element `i` and its row-major m×n output:
/// side by side on the pool (each product on one thread) or one after the other (each split
/// over the pool when large), as [`side_by_side`] decides.
pub(super) fn for_each_product(
    out: &mut [f32],
    d: &Dims,
    one: impl Fn(usize, &mut [f32], Parallelism) + Sync,
) {
    let size = d.m * d.n;
    if side_by_side(d) {
        out.par_chunks_mut(size)
            .enumerate()
            .for_each(|(i, o)| one(i, o, Parallelism::None));
    } else {
        for (i, o) in out.chunks_mut(size).enumerate() {
            one(i, o, parallelism(d));
        }
    }
}

/// gemm's f32 `dst (m × n, row stride ldd) = a (m × k) · b (k × n)`, each operand given by its
/// first element and its (row, column) strides.
///
/// # Safety
/// Every element the shapes and strides address must lie inside its allocation, and `dst`'s
/// m rows of n must be writable and alias neither operand.
pub(super) unsafe fn gemm_f32(
    [m, n, k]: [usize; 3],
    (dst, ldd): (*mut f32, usize),
    (a, ars, acs): (*const f32, isize, isize),
    (b, brs, bcs): (*const f32, isize, isize),
    par: Parallelism,
) {
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            ldd as isize,
            false,
            a,
            acs,
            ars,
            b,
            bcs,
            brs,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// Widens a strided 16-bit matrix into contiguous f32, keeping its memory order; returns the
/// (row, column) strides of the copy. `parallel`: over the pool (a large product's panel),
/// else on this thread (one of many small products running side by side).
#[allow(clippy::too_many_arguments)]
fn widen<H: Elem>(
    src: &[H],
    off: usize,
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
    dst: &mut [f32],
    parallel: bool,
) -> (isize, isize) {
    let (rs, cs) = (rs as usize, cs as usize);
    let dst = &mut dst[..rows * cols];
    if cs == 1 || rs == 1 {
        // Contiguous lines: rows when row-major, columns when column-major.
        let (line, step) = if cs == 1 { (cols, rs) } else { (rows, cs) };
        by_lines(dst, line, parallel, |i, d| {
            for (o, v) in d
                .iter_mut()
                .zip(&src[off + i * step..off + i * step + line])
            {
                *o = v.to_f32();
            }
        });
        if cs == 1 {
            (cols as isize, 1)
        } else {
            (1, rows as isize)
        }
    } else {
        for r in 0..rows {
            for c in 0..cols {
                dst[r * cols + c] = src[off + r * rs + c * cs].to_f32();
            }
        }
        (cols as isize, 1)
    }
}

/// Rounds the row-major f32 panel `src` into `dst` (same length), in parallel when asked.
fn narrow<H: Elem>(src: &[f32], dst: &mut [H], line: usize, parallel: bool) {
    by_lines(dst, line, parallel, |i, d| {
        for (o, &v) in d.iter_mut().zip(&src[i * line..]) {
            *o = H::from_f32(v);
        }
    });
}

/// Runs `f(i, line_i)` over the `line`-long lines of `dst` with AVX-512 element loops, a few
/// lines (about 16K elements) to a task when `parallel`. Conversions are exact or correctly
/// rounded per element, so the split does not change a bit.
fn by_lines<U: Send>(
    dst: &mut [U],
    line: usize,
    parallel: bool,
    f: impl Fn(usize, &mut [U]) + Sync + Send,
) {
    if line == 0 {
        return;
    }
    let per = ((1 << 14) / line).max(1);
    let task = |(t, chunk): (usize, &mut [U])| {
        wide(
            #[inline(always)]
            || {
                for (j, d) in chunk.chunks_mut(line).enumerate() {
                    f(t * per + j, d);
                }
            },
        )
    };
    if parallel {
        dst.par_chunks_mut(per * line).enumerate().for_each(task);
    } else {
        dst.chunks_mut(per * line).enumerate().for_each(task);
    }
}

/// The `temporary` scratch of a bf16 product of `d` on the kernel in use (`bf16_gemm`).
/// Shared with the shape-only backend, whose dry runs must allocate the same bytes.
pub fn bf16_scratch(device: &Device, d: Dims) -> Result<Vec<Scratch>> {
    match bf16_gemm::bf16_gemm() {
        #[cfg(target_arch = "x86_64")]
        Bf16Gemm::Amx => Ok(bf16_gemm::amx::scratch(device, d)?.into()),
        #[cfg(target_arch = "x86_64")]
        Bf16Gemm::Native => Ok(bf16_gemm::native_scratch(device, d)?.into()),
        #[cfg(target_arch = "x86_64")]
        Bf16Gemm::Fma => Ok(bf16_gemm::fma_bf16_scratch(device, d)?.into()),
        _ => widening_scratch(device, d),
    }
}

/// Whether a widened product runs its batch elements in parallel (each single-threaded, with
/// its own scratch) rather than one after the other with gemm's threads.
fn batch_parallel(d: &Dims) -> bool {
    d.batch > 1 && d.m * d.n * d.k < SMALL
}

/// The f32 scratch a 16-bit product of `d` widens into, per set: the right operand (K, N),
/// one panel of the left operand (TILE_M, K) and one output panel (TILE_M, N). One set, or one
/// per thread (at most one per batch element) when the batch runs in parallel. Shared with the
/// shape-only backend, whose dry runs must allocate the same bytes.
pub fn widening_scratch(device: &Device, d: Dims) -> Result<Vec<Scratch>> {
    let tile = TILE_M.min(d.m).max(1);
    let sets = if batch_parallel(&d) {
        rayon::current_num_threads().min(d.batch)
    } else {
        1
    };
    let mut out = Vec::with_capacity(3 * sets);
    for _ in 0..sets {
        out.push(scratch_f32(device, d.k * d.n, "matmul.widen.rhs")?);
        out.push(scratch_f32(device, tile * d.k, "matmul.widen.lhs_tile")?);
        out.push(scratch_f32(device, tile * d.n, "matmul.widen.out_tile")?);
    }
    Ok(out)
}

/// bf16 `out = a @ b` on the kernel in use: AMX tiles, native `VDPBF16PS`, f32 FMA on packed
/// copies, or widening to f32 around gemm.
pub fn matmul_bf16(
    device: &Device,
    a: &[bf16],
    la: &Layout,
    b: &[bf16],
    lb: &Layout,
    out: &mut [bf16],
    d: Dims,
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    match bf16_gemm::bf16_gemm() {
        Bf16Gemm::Amx => return bf16_gemm::amx::matmul(device, a, la, b, lb, out, d),
        Bf16Gemm::Native => return bf16_gemm::native(device, (a, la), (b, lb), out, d),
        Bf16Gemm::Fma => return bf16_gemm::fma_bf16(device, (a, la), (b, lb), out, d),
        Bf16Gemm::Widening => {}
    }
    matmul_widening(device, a, la, b, lb, out, d)
}

/// One widening set's f32 buffers: right operand, left panel, output panel.
type Tiles<'s> = (&'s mut [f32], &'s mut [f32], &'s mut [f32]);

/// 16-bit `out = a @ b` through f32 tiles and gemm's f32 kernel: bf16 on CPUs without
/// AVX512_BF16, and f16 everywhere (gemm's own f16 kernel measured slower than this on CPUs
/// without AVX512-FP16; `docs/benchmarks.md`). Small batched products (attention's per-head
/// products) run their batch elements in parallel, each with its own set of tiles.
pub(crate) fn matmul_widening<H: Elem>(
    device: &Device,
    a: &[H],
    la: &Layout,
    b: &[H],
    lb: &Layout,
    out: &mut [H],
    d: Dims,
) -> Result<()> {
    let (ba, ars, acs) = split(la);
    let (bb, brs, bcs) = split(lb);
    let mut scratch = widening_scratch(device, d)?;
    let mut sets: Vec<Tiles> = Vec::with_capacity(scratch.len() / 3);
    let mut rest = scratch.as_mut_slice();
    while let [bt, at, ot, tail @ ..] = rest {
        sets.push((bt.slice_mut(), at.slice_mut(), ot.slice_mut()));
        rest = tail;
    }
    // `threads`: whether gemm may split a panel's product over the pool.
    let product = |i: usize, o: &mut [H], tiles: &mut Tiles, threads: bool| {
        let (bt, at, ot) = tiles;
        let tile = TILE_M.min(d.m).max(1);
        let (brs_t, bcs_t) = widen(b, bb.index_of(i), d.k, d.n, brs, bcs, bt, threads);
        for i0 in (0..d.m).step_by(tile) {
            let rows = tile.min(d.m - i0);
            let (ars_t, acs_t) = widen(
                a,
                ba.index_of(i) + i0 * ars as usize,
                rows,
                d.k,
                ars,
                acs,
                at,
                threads,
            );
            let par = match threads {
                true => parallelism(&Dims {
                    batch: 1,
                    m: rows,
                    n: d.n,
                    k: d.k,
                }),
                false => Parallelism::None,
            };
            // SAFETY: the tiles hold rows×K, K×N and rows×N f32 values with the strides
            // returned by `widen` and the row-major output tile.
            unsafe {
                gemm::gemm(
                    rows,
                    d.n,
                    d.k,
                    ot.as_mut_ptr(),
                    1,
                    d.n as isize,
                    false,
                    at.as_ptr(),
                    acs_t,
                    ars_t,
                    bt.as_ptr(),
                    bcs_t,
                    brs_t,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    par,
                )
            };
            narrow(
                &ot[..rows * d.n],
                &mut o[i0 * d.n..(i0 + rows) * d.n],
                d.n,
                threads,
            );
        }
    };
    let size = d.m * d.n;
    if batch_parallel(&d) {
        let sets: Vec<Mutex<Tiles>> = sets.into_iter().map(Mutex::new).collect();
        out.par_chunks_mut(size).enumerate().for_each(|(i, o)| {
            // Each worker takes its own set; small products run no nested parallel work, so a
            // worker never starts a second product while holding one.
            let t = rayon::current_thread_index().unwrap_or(0) % sets.len();
            let mut tiles = sets[t].lock().unwrap_or_else(|e| e.into_inner());
            product(i, o, &mut tiles, false);
        });
    } else {
        let tiles = &mut sets[0];
        for (i, o) in out.chunks_mut(size).enumerate() {
            product(i, o, tiles, true);
        }
    }
    Ok(())
}
