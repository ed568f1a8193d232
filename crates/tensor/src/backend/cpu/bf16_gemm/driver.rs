//! The driver of the packed bf16 GEMMs (`flavor`): batches, packing into scratch, and the task
//! grid over C that the threads share (see the parent module for the scheme).
//!
//! Not for: the arithmetic (`kernel`, `fma_kernel`) or the packed layouts (`pack`,
//! `fma_pack`).

use super::flavor::Flavor;
use super::kernel::{Sliver, Store};
use super::pack::{PACK_GROUP, Strided};
use super::{MR, NR, Packed, SMALL, for_each_product, scratch};
use crate::backend::cpu::Scratch;
use crate::backend::cpu::matmul::Dims;
use crate::error::Result;
use crate::shape::Layout;
use half::bf16;
use headroom_memory::Device;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Packed units (k-pairs of bf16, or k of f32) per k block: the 64-column B block is
/// `BLOCK_UNITS`·256 bytes, 32 KiB, which leaves room in a 32 KiB (Zen 4) or 48 KiB (Zen 5,
/// Intel Xeons) L1D for the A sliver streaming by.
const BLOCK_UNITS: usize = 128;
/// Most slivers (of 6 rows) one task owns; also the size of its f32 tile of partial sums
/// (64 · 6 · 64 · 4 bytes = 96 KiB on the stack).
const SLIVERS_PER_TASK: usize = 64;
/// Bytes of packed A a task may keep for rereading: half of a 1 MiB L2 (Zen 4 and Zen 5).
const A_IN_L2: usize = 512 << 10;
/// Fewest slivers per task however deep k is (each B block from L1 serves at least these).
const MIN_SLIVERS: usize = 8;

/// bf16 `out (batch, m, n) = a @ b` on flavor `F`.
///
/// # Panics
/// When `F::supported()` is false (callers check it through `bf16_gemm::bf16_gemm`).
pub(crate) fn matmul<F: Flavor>(
    device: &Device,
    (a, la): (&[bf16], &Layout),
    (b, lb): (&[bf16], &Layout),
    out: &mut [bf16],
    d: Dims,
) -> Result<()> {
    assert!(F::supported(), "this CPU lacks the GEMM's instructions");
    let p = Packed::of(&d, F::DEPTH);
    // Held as the array, so the left buffer is freed before the right one: the order a dry run
    // frees them in. The cache's state after the free, and so later peaks, depend on it.
    let mut scratch = scratch::<F>(device, d)?;
    let [sa, sb] = &mut scratch;
    for_each_product(
        (bytemuck::cast_slice(a), la),
        (bytemuck::cast_slice(b), lb),
        bytemuck::cast_slice_mut(out),
        (&d, SMALL),
        (words(sa), words(sb)),
        (p.a_words(), p.b_words()),
        |av, bv, o, pa, pb, parallel| product::<F>(av, bv, o, pa, pb, &d, p, parallel),
    );
    Ok(())
}

fn words(s: &mut Scratch) -> &mut [u32] {
    bytemuck::cast_slice_mut(s.slice_mut())
}

/// A raw pointer to C that tasks share: each writes only its own rows × columns.
#[derive(Debug, Clone, Copy)]
struct OutPtr(*mut u16);
// SAFETY: tasks write disjoint blocks of C through it (see `product`), and C outlives them.
unsafe impl Send for OutPtr {}
// SAFETY: as above; no task reads C.
unsafe impl Sync for OutPtr {}

/// One product: pack A and B, then run the tasks over C (`out`, m × n row-major).
#[allow(clippy::too_many_arguments)]
fn product<F: Flavor>(
    a: Strided,
    b: Strided,
    out: &mut [u16],
    pa: &mut [u32],
    pb: &mut [u32],
    d: &Dims,
    p: Packed,
    parallel: bool,
) {
    let (m, n, k) = (d.m, d.n, d.k);
    let (pa, pb) = (&mut pa[..p.a_words()], &mut pb[..p.b_words()]);
    // A row-major A whose k pairs are whole is read where it lies; its scratch stays allocated
    // (the scratch depends on the dims alone, as dry runs count it) but unused.
    let a_in_place = F::A_IN_PLACE && a.cs == 1 && k % 2 == 0;
    let (block_units, _) = k_blocks(p.units);
    // Both operands are stored k block by k block, so what a task reads for one block (its
    // slivers, one panel) is one contiguous stream that hardware prefetchers follow.
    let (a_block, b_block) = (p.slivers * block_units * MR, p.panels * block_units * NR);
    // Packing units: a group of slivers (or panels) for one k block.
    let pack_a = |blk: usize, g: usize, dst: &mut [u32]| {
        let us = blk * block_units..(blk * block_units + block_units).min(p.units);
        // SAFETY: `product` runs only when `F::supported()` holds (asserted in `matmul`).
        unsafe { F::pack_a(a, m, k, g * PACK_GROUP, us, dst) }
    };
    let pack_b = |blk: usize, g: usize, dst: &mut [u32]| {
        let us = blk * block_units..(blk * block_units + block_units).min(p.units);
        // SAFETY: as for `pack_a`.
        unsafe { F::pack_b(b, k, n, g * PACK_GROUP, us, dst) }
    };
    let pack_a_all = |pa: &mut [u32]| pack_blocks(pa, (a_block, p.slivers), parallel, pack_a);
    let pack_b_all = |pb: &mut [u32]| pack_blocks(pb, (b_block, p.panels), parallel, pack_b);
    match (a_in_place, parallel) {
        (true, _) => pack_b_all(pb),
        (false, true) => {
            rayon::join(|| pack_a_all(pa), || pack_b_all(pb));
        }
        (false, false) => {
            pack_a_all(pa);
            pack_b_all(pb);
        }
    }
    let grid = Grid::new(
        p,
        if parallel {
            rayon::current_num_threads()
        } else {
            1
        },
    );
    let c = OutPtr(out.as_mut_ptr());
    let (pa, pb) = (&*pa, &*pb);
    let a_src = if a_in_place {
        ASource::InPlace(a)
    } else {
        ASource::Packed(pa)
    };
    let task = |t: usize| grid.run::<F>(t, a_src, pb, c, m, n);
    if parallel {
        (0..grid.tasks()).into_par_iter().for_each(task);
    } else {
        (0..grid.tasks()).for_each(task);
    }
}

/// Fills a packed operand `buf`, k block by k block (`block` dwords each, holding `across` runs
/// of equal length: slivers or panels), in units of `PACK_GROUP` runs: `pack(blk, unit, dst)`
/// packs unit `unit` of block `blk`. Units run in parallel when `parallel`.
fn pack_blocks(
    buf: &mut [u32],
    (block, across): (usize, usize),
    parallel: bool,
    pack: impl Fn(usize, usize, &mut [u32]) + Sync,
) {
    let unit = |blk_buf: &[u32]| PACK_GROUP * (blk_buf.len() / across);
    if parallel {
        buf.par_chunks_mut(block)
            .enumerate()
            .for_each(|(blk, blk_buf)| {
                let size = unit(blk_buf);
                let units = blk_buf.par_chunks_mut(size).enumerate();
                units.for_each(|(g, dst)| pack(blk, g, dst))
            });
    } else {
        for (blk, blk_buf) in buf.chunks_mut(block).enumerate() {
            let size = unit(blk_buf);
            for (g, dst) in blk_buf.chunks_mut(size).enumerate() {
                pack(blk, g, dst);
            }
        }
    }
}

/// Units per k block and the number of blocks: `units` cut into equal blocks of at most
/// `BLOCK_UNITS` (the last may be shorter). It depends on k alone, so it fixes the order in
/// which every element of C adds its products.
fn k_blocks(units: usize) -> (usize, usize) {
    let blocks = units.div_ceil(BLOCK_UNITS).max(1);
    let block_units = units.div_ceil(blocks);
    (block_units, units.div_ceil(block_units))
}

/// Where the kernel reads A from.
#[derive(Clone, Copy)]
enum ASource<'a> {
    /// Packed slivers (`Flavor::pack_a`), k block by k block.
    Packed(&'a [u32]),
    /// A row-major A (unit column stride, even k) as it lies.
    InPlace(Strided<'a>),
}

impl ASource<'_> {
    /// Sliver `s` of A for the k block of `np` units from unit `p0`; `p` gives the packed
    /// layout. Rows past `m` (a ragged last sliver) repeat row m − 1: their sums land in rows
    /// of the tile that are never stored to C.
    fn sliver(&self, p: &Packed, s: usize, p0: usize, np: usize, m: usize) -> Sliver {
        match *self {
            ASource::Packed(pa) => {
                Sliver::packed(pa[(p.slivers * p0 + s * np) * MR..][..np * MR].as_ptr())
            }
            ASource::InPlace(a) => {
                let row = |r: usize| {
                    let i = (s * MR + r).min(m - 1);
                    // Pairs p0..p0 + np of row i: elements 2·p0 .. 2·(p0 + np) ≤ k.
                    a.data[a.off + i * a.rs + 2 * p0..][..2 * np]
                        .as_ptr()
                        .cast::<u8>()
                };
                Sliver {
                    rows: std::array::from_fn(row),
                    step: 4,
                }
            }
        }
    }
}

/// How C is cut into tasks: `sliver_step` slivers × `panel_step` panels each.
#[derive(Debug, Clone, Copy)]
struct Grid {
    p: Packed,
    sliver_step: usize,
    panel_step: usize,
    /// Units per k block, and the number of blocks.
    block_units: usize,
    blocks: usize,
}

impl Grid {
    /// Cuts rows first, into as few tasks as the thread count and L2 allow. A task walks its
    /// panels and, for each, all of k over its slivers: every sliver reuses each B block from
    /// L1, so more slivers per task mean fewer B loads, but the task's packed A (slivers ×
    /// units × 24 bytes) must stay in L2 to be reread for every panel, which caps the slivers at
    /// large k. Panels are cut too when rows alone give fewer than two tasks per thread.
    fn new(p: Packed, threads: usize) -> Grid {
        let fit = (A_IN_L2 / (p.units * MR * 4)).clamp(MIN_SLIVERS, SLIVERS_PER_TASK);
        let row_tasks = p
            .slivers
            .div_ceil(fit)
            .next_multiple_of(threads.max(1))
            .min(p.slivers);
        let sliver_step = p.slivers.div_ceil(row_tasks);
        let row_tasks = p.slivers.div_ceil(sliver_step);
        let target = if threads > 1 { 2 * threads } else { 1 };
        let panel_groups = target.div_ceil(row_tasks).clamp(1, p.panels);
        let (block_units, blocks) = k_blocks(p.units);
        Grid {
            p,
            sliver_step,
            panel_step: p.panels.div_ceil(panel_groups),
            block_units,
            blocks,
        }
    }

    fn tasks(&self) -> usize {
        self.p.slivers.div_ceil(self.sliver_step) * self.p.panels.div_ceil(self.panel_step)
    }

    /// Runs task `t`: its panels one by one, k block by k block, every sliver per block.
    fn run<F: Flavor>(&self, t: usize, a: ASource, pb: &[u32], c: OutPtr, m: usize, n: usize) {
        let row_tasks = self.p.slivers.div_ceil(self.sliver_step);
        let (s0, j0) = (
            (t % row_tasks) * self.sliver_step,
            (t / row_tasks) * self.panel_step,
        );
        let (s1, j1) = (
            (s0 + self.sliver_step).min(self.p.slivers),
            (j0 + self.panel_step).min(self.p.panels),
        );
        let units = self.p.units;
        // Written by a k block before the next one reads it, so it needs no initialising (a
        // 96 KiB memset per task would cost as much as a small product).
        let mut tile = [MaybeUninit::<f32>::uninit(); SLIVERS_PER_TASK * MR * NR];
        for j in j0..j1 {
            for blk in 0..self.blocks {
                let p0 = blk * self.block_units;
                let np = self.block_units.min(units - p0);
                let last = blk + 1 == self.blocks;
                for s in s0..s1 {
                    let part = tile[(s - s0) * MR * NR..].as_mut_ptr().cast::<f32>();
                    let store = if last {
                        Store::Out {
                            // SAFETY: row s·MR, column j·NR lie inside the m × n C.
                            ptr: unsafe { c.0.add(s * MR * n + j * NR) },
                            ld: n,
                            rows: MR.min(m - s * MR),
                            cols: NR.min(n - j * NR),
                        }
                    } else {
                        Store::Tile(part)
                    };
                    let a = a.sliver(&self.p, s, p0, np, m);
                    let b = pb[(self.p.panels * p0 + j * np) * NR..][..np * NR].as_ptr();
                    // SAFETY: `product` runs only when `F::supported()` holds (asserted in
                    // `matmul`); each row of the sliver holds np units (`ASource::sliver`
                    // slices them: np·MR packed dwords, or 2·np bf16 of a row in place, and
                    // A_IN_PLACE flavors are the only ones handed the latter), the slice of B
                    // np·NR packed dwords; `part`
                    // is this task's MR·NR f32 of the stack tile, read only when blk > 0,
                    // after block blk − 1 wrote all of it; the C corner is clipped to m × n,
                    // and no other task owns slivers s0..s1 of panels j0..j1.
                    unsafe { F::tile(np, a, b, (blk > 0).then_some(part), store) };
                }
            }
        }
    }
}
