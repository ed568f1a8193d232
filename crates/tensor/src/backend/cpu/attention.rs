//! Memory-efficient (FlashAttention-style) attention on the CPU: `softmax(mask(q kᵀ·scale)) v`
//! over `(B, H, T, D)` views, tiled over blocks of [`TILE`] queries and [`TILE`] keys with an
//! online softmax (Rabe & Staats 2021; Dao et al. 2022). Per query row only the running max
//! `m`, the running sum `l` and an f32 output accumulator live at a time; the forward writes
//! the output and the row log-sum-exp `L = m + ln l`, and the backward recomputes each score
//! tile from q, k and `L` (p = exp(s − L)). No buffer of T×T elements is ever allocated: the
//! only workspace is one `temporary` scratch of a few tiles per lane (the "SRAM" of the
//! algorithm) and, in backward, the row vector `Dᵢ = dOᵢ·Oᵢ` (B·H·T f32).
//! Tile products (S = Q Kᵀ, P V, dO Vᵀ, Pᵀ dO, dSᵀ Q, dS K) run on one thread each, on the
//! register kernel of `attention_tile.rs`; the task bodies (online softmax, probabilities)
//! are compiled for AVX-512 where the CPU has it (`simd::wide`, same bits).
//!
//! Grouped-query attention (Ainslie et al. 2023) is native: k and v may have fewer heads than q
//! (`Hkv` dividing `H`), and query head `g = b·H + h` reads key/value head `g / (H / Hkv)` =
//! `b·Hkv + h / (H / Hkv)` in place, so no key or value is ever repeated per query head.
//!
//! Parallelism and determinism: the work is split into tasks of one (batch, head, block);
//! forward and dQ tasks own a block of query rows of one query head, dK/dV tasks own a block of
//! key rows of one key/value head and sum over the query heads of its group (ascending), then
//! their query blocks, so every output element is written by exactly one task and accumulated
//! in a fixed order (keys, resp. query heads then queries, ascending) whatever the thread count. Lanes (each with its own scratch slice) take
//! tasks round-robin; a task overwrites all the scratch it reads, so which lane runs it does not
//! matter. Causal key blocks entirely above the diagonal are skipped; within a diagonal block
//! each row stops at its own position.
//!
//! Dropout on the probabilities draws its mask from the counter-based generator at
//! `offset + ((b·H + h)·T + i)·T + j`, so the backward recomputes exactly the forward's mask.
//!
//! The backward lives in `attention/backward.rs`.
//!
//! Not for: shape or dtype checks, or allocating outputs (see `ops::attention`).

mod backward;

pub use backward::backward;

use super::attention_tile::{Mat, load_transposed, product, rows_of};
use super::math::fast_exp;
use super::simd::wide;
use super::{Scratch, scratch_f32, slice, slice_mut, unsupported};
use crate::backend::{AttentionSpec, Dst, Src};
use crate::dtype::{Elem, with_float_type};
use crate::error::{Result, TensorError};
use crate::rng;
use headroom_memory::Device;
use rayon::prelude::*;
use std::marker::PhantomData;

/// Queries (and keys) per tile.
pub const TILE: usize = 64;

/// A `(B, H, T, D)` view with unit stride along D: where row `(b, h, i)` starts.
#[derive(Clone, Copy, Debug)]
struct Bhtd {
    h: usize,
    t: usize,
    d: usize,
    offset: usize,
    sb: usize,
    sh: usize,
    st: usize,
}

impl Bhtd {
    fn of(op: &'static str, s: &[usize], strides: &[usize], offset: usize) -> Result<Bhtd> {
        if s.len() != 4 || (s[3] > 1 && strides[3] != 1) {
            return Err(TensorError::invalid(
                op,
                format!(
                    "needs a (B, H, T, D) view with unit stride along D, got shape {s:?} strides {strides:?}"
                ),
            ));
        }
        Ok(Bhtd {
            h: s[1],
            t: s[2],
            d: s[3],
            offset,
            sb: strides[0],
            sh: strides[1],
            st: strides[2],
        })
    }

    fn src(op: &'static str, x: &Src) -> Result<Bhtd> {
        Bhtd::of(op, x.layout.shape(), x.layout.strides(), x.layout.offset())
    }

    /// An output view: besides the shape rule, no two rows may share an element.
    fn dst(op: &'static str, x: &Dst) -> Result<Bhtd> {
        let l = Bhtd::of(op, x.layout.shape(), x.layout.strides(), x.layout.offset())?;
        let s = x.layout.shape();
        let mut dims: Vec<(usize, usize)> = (0..3)
            .filter(|&a| s[a] > 1)
            .map(|a| (x.layout.strides()[a], s[a]))
            .collect();
        dims.sort_unstable();
        let mut span = l.d; // elements covered by one step of the previous (inner) dim
        for (stride, size) in dims {
            if stride < span {
                return Err(TensorError::invalid(op, "the output view overlaps itself"));
            }
            span = stride * size;
        }
        Ok(l)
    }

    /// Index of element 0 of row `i` of head `g = b·H + h`.
    #[inline(always)]
    fn row(&self, g: usize, i: usize) -> usize {
        self.offset + (g / self.h) * self.sb + (g % self.h) * self.sh + i * self.st
    }
}

/// Rows of an output written by parallel tasks, each row by exactly one task.
struct Rows<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: `Rows` only writes through `store`, whose contract gives each caller exclusive rows;
// `T` is a plain number type.
unsafe impl<T: Send> Send for Rows<'_, T> {}
unsafe impl<T: Send> Sync for Rows<'_, T> {}

impl<'a, T: Elem> Rows<'a, T> {
    fn new(out: &'a mut [T]) -> Rows<'a, T> {
        Rows {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _borrow: PhantomData,
        }
    }

    /// Writes `vals · mul` (rounded to `T`) at `start..start + vals.len()`.
    ///
    /// # Safety
    /// No other thread may read or write that range while this runs.
    #[inline(always)]
    unsafe fn store(&self, start: usize, vals: &[f32], mul: f32) {
        assert!(start + vals.len() <= self.len, "attention row out of range");
        for (c, &v) in vals.iter().enumerate() {
            // SAFETY: in bounds (asserted above); exclusive by the caller's contract.
            unsafe { self.ptr.add(start + c).write(T::from_f32(v * mul)) };
        }
    }
}

/// The dropout multiplier of probability `(g, i, j)`: 0 or 1/(1 − p); 1 without dropout.
#[inline(always)]
fn keep(spec: &AttentionSpec, t: usize, g: usize, i: usize, j: usize) -> f32 {
    match spec.dropout {
        None => 1.0,
        Some((p, seed, offset)) => {
            let at = offset + ((g * t + i) * t + j) as u64;
            if rng::uniform(seed, at) >= p {
                1.0 / (1.0 - p)
            } else {
                0.0
            }
        }
    }
}
/// Keys of block `j0..j0 + cols` that row `i` attends to, `lo..n` of the block: a prefix
/// under the causal mask, the part inside the window under a sliding window (empty when
/// `lo >= n`).
#[inline(always)]
fn visible(spec: &AttentionSpec, i: usize, j0: usize, cols: usize) -> (usize, usize) {
    if !spec.causal {
        return (0, cols);
    }
    let n = cols.min((i + 1).saturating_sub(j0));
    let lo = spec.window.map_or(0, |w| {
        (i + 1).saturating_sub(w).saturating_sub(j0).min(cols)
    });
    (lo, n)
}

/// The `temporary` tile scratch of `n_tasks` tasks: `per_lane` floats for each of their lanes.
fn tiles_scratch(device: &Device, n_tasks: usize, per_lane: usize) -> Result<Scratch> {
    scratch_f32(device, lanes(n_tasks) * per_lane, "attention.tiles")
}

/// Runs `n_tasks` tasks round-robin on lanes that each own `per_lane` floats of one
/// [`tiles_scratch`], freed when they are done.
fn run_lanes(
    device: &Device,
    per_lane: usize,
    n_tasks: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) -> Result<()> {
    let mut scratch = tiles_scratch(device, n_tasks, per_lane)?;
    let lanes = lanes(n_tasks);
    scratch
        .slice_mut()
        .par_chunks_mut(per_lane)
        .enumerate()
        .for_each(|(lane, buf)| {
            for task in (lane..n_tasks).step_by(lanes) {
                wide(
                    #[inline(always)]
                    || f(task, buf),
                );
            }
        });
    Ok(())
}

/// f32 elements of one lane's forward workspace: q, k, v tiles and the output accumulator
/// (TILE, D); the score tile (TILE, TILE); the running max m and sum l (TILE,).
fn forward_per_lane(d: usize) -> usize {
    4 * TILE * d + TILE * TILE + 2 * TILE
}

/// f32 elements of one lane's workspace in either backward pass (dK/dV or dQ): six (TILE, D)
/// tiles and two (TILE, TILE) score tiles (`backward::tiles`).
fn backward_per_lane(d: usize) -> usize {
    6 * TILE * d + 2 * TILE * TILE
}

/// Allocates and frees, in the kernels' order, the `temporary` scratch a forward (`backward`:
/// `None`) or a backward of (heads, t, d) uses, without computing: the shape-only backend's
/// stand-in, so dry runs see the same bytes as real runs. `heads` counts query heads (B·H),
/// `kv_heads` key/value heads (B·Hkv).
pub fn reserve_workspace(
    device: &Device,
    (heads, kv_heads): (usize, usize),
    t: usize,
    d: usize,
    backward: Option<(bool, bool)>,
) -> Result<()> {
    let nb = t.div_ceil(TILE);
    let tasks = heads * nb;
    if tasks == 0 {
        return Ok(());
    }
    match backward {
        None => drop(tiles_scratch(device, tasks, forward_per_lane(d))?),
        Some((want_kv, want_q)) => {
            let _delta = scratch_f32(device, heads * t, "attention.delta")?;
            if want_kv {
                drop(tiles_scratch(device, kv_heads * nb, backward_per_lane(d))?);
            }
            if want_q {
                drop(tiles_scratch(device, tasks, backward_per_lane(d))?);
            }
        }
    }
    Ok(())
}

/// Query heads per key/value head, `H / Hkv`: 1 without grouping. The entry op checked that
/// `Hkv` divides `H` and that the other axes agree.
fn group_of(op: &'static str, q: Bhtd, k: Bhtd) -> Result<usize> {
    if k.h == 0 || !q.h.is_multiple_of(k.h) || q.t != k.t || q.d != k.d {
        return Err(TensorError::invalid(
            op,
            format!(
                "key/value heads {} must divide query heads {} with the same T and D",
                k.h, q.h
            ),
        ));
    }
    Ok(q.h / k.h)
}

/// How many lanes (scratch slices) `n_tasks` tasks run on: a few per thread, for balance.
fn lanes(n_tasks: usize) -> usize {
    n_tasks.min(4 * rayon::current_num_threads()).max(1)
}

/// Splits `buf` into consecutive pieces of the given lengths.
fn carve<const N: usize>(mut buf: &mut [f32], lens: [usize; N]) -> [&mut [f32]; N] {
    lens.map(|n| {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(n);
        buf = tail;
        head
    })
}

/// The forward: writes the output `o` and the row log-sum-exp `lse` (f32, one per query row)
/// that the backward recomputes the probabilities from.
pub fn forward(
    q: &Src,
    k: &Src,
    v: &Src,
    spec: &AttentionSpec,
    o: &mut Dst,
    lse: &mut Dst,
) -> Result<()> {
    let device = o.buf.device().clone();
    let (lq, lk, lv) = (
        Bhtd::src("attention", q)?,
        Bhtd::src("attention", k)?,
        Bhtd::src("attention", v)?,
    );
    let lo = Bhtd::dst("attention", o)?;
    let heads = q.layout.shape()[0] * lq.h;
    let group = group_of("attention", lq, lk)?;
    let lse_offset = lse.layout.offset();
    with_float_type!(q.dtype, T => forward_typed::<T>(
        &device,
        [(slice::<T>(q)?, lq), (slice::<T>(k)?, lk), (slice::<T>(v)?, lv)],
        (heads, group),
        spec,
        (slice_mut::<T>(o)?, lo),
        &mut slice_mut::<f32>(lse)?[lse_offset..],
    ), _ => Err(unsupported("attention", q.dtype)))
}

fn forward_typed<T: Elem>(
    device: &Device,
    [(q, lq), (k, lk), (v, lv)]: [(&[T], Bhtd); 3],
    (heads, group): (usize, usize),
    spec: &AttentionSpec,
    (o, lo): (&mut [T], Bhtd),
    lse: &mut [f32],
) -> Result<()> {
    let (t, d) = (lq.t, lq.d);
    let nq = t.div_ceil(TILE);
    let n_tasks = heads * nq;
    if n_tasks == 0 {
        return Ok(());
    }
    let (o, lse) = (Rows::new(o), Rows::new(lse));
    run_lanes(
        device,
        forward_per_lane(d),
        n_tasks,
        #[inline(always)]
        |task, buf| {
            let [qt, kt, vt, acc, s, m, l] = carve(
                buf,
                [
                    TILE * d,
                    TILE * d,
                    TILE * d,
                    TILE * d,
                    TILE * TILE,
                    TILE,
                    TILE,
                ],
            );
            let (g, i0) = (task / nq, (task % nq) * TILE);
            let gk = g / group; // the key/value head of query head g
            let rows = TILE.min(t - i0);
            let qm = rows_of(q, (lq.row(g, i0), lq.st), (rows, d), qt);
            m.fill(f32::NEG_INFINITY);
            l.fill(0.0);
            acc.fill(0.0);
            let key_end = if spec.causal { i0 + rows } else { t };
            for j0 in (0..key_end).step_by(TILE) {
                let cols = TILE.min(t - j0);
                load_transposed(k, |c| lk.row(gk, j0 + c), (cols, d), kt, TILE); // Kᵀ (D, cols)
                // S = scale · Q Kᵀ (rows, cols)
                let ktm = Mat::new(kt, d, cols, TILE);
                product(s, TILE, false, (qm, false), ktm, spec.scale);
                for r in 0..rows {
                    let i = i0 + r;
                    let (lo, n) = visible(spec, i, j0, cols);
                    let n = n.max(lo);
                    let sr = &mut s[r * TILE..r * TILE + cols];
                    if n > lo {
                        // Online softmax: rescale what was accumulated under the old max.
                        let m_new = sr[lo..n].iter().fold(m[r], |a, &b| a.max(b));
                        let correction = fast_exp(m[r] - m_new);
                        acc[r * d..(r + 1) * d]
                            .iter_mut()
                            .for_each(|x| *x *= correction);
                        sr[lo..n].iter_mut().for_each(|x| *x = fast_exp(*x - m_new));
                        l[r] = l[r] * correction + sr[lo..n].iter().sum::<f32>();
                        if spec.dropout.is_some() {
                            for (c, x) in sr[lo..n].iter_mut().enumerate() {
                                *x *= keep(spec, t, g, i, j0 + lo + c);
                            }
                        }
                        m[r] = m_new;
                    }
                    sr[..lo].fill(0.0);
                    sr[n..].fill(0.0);
                }
                // acc += P V (rows, D)
                let vm = rows_of(v, (lv.row(gk, j0), lv.st), (cols, d), &mut *vt);
                let pm = Mat::new(s, rows, cols, TILE);
                product(acc, d, true, (pm, false), vm, 1.0);
            }
            for r in 0..rows {
                let i = i0 + r;
                // SAFETY: row (g, i) of `o` and element (g, i) of `lse` belong to this task only
                // (tasks own disjoint query blocks; `Bhtd::dst` checked that rows do not overlap).
                unsafe {
                    o.store(lo.row(g, i), &acc[r * d..(r + 1) * d], 1.0 / l[r]);
                    lse.store(g * t + i, &[m[r] + l[r].ln()], 1.0);
                }
            }
        },
    )?;
    Ok(())
}
