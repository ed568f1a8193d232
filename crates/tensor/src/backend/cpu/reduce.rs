//! Reductions over any set of axes: each output element sums (or maxes) its inputs in one
//! fixed row-major order in f32, so results do not depend on the thread count.
//!
//! Speed: a sum over leading axes of contiguous data (a bias gradient folding (B, T, C) to
//! (C)) runs row by row, adding each input row into a row of f32 accumulators — the same
//! additions in the same order per output element as the general path, but over contiguous
//! slices that vectorise across columns instead of a strided walk per output element.
//!
//! Not for: row-wise fused kernels like softmax (see `rows`).

use super::simd::wide;
use crate::backend::ReduceOp;
use crate::dtype::Elem;
use crate::shape::{Layout, numel};
use rayon::prelude::*;

pub fn reduce<T: Elem>(x: &[T], lx: &Layout, axes: &[usize], op: ReduceOp, out: &mut [T]) {
    let leading =
        !axes.is_empty() && axes.len() < lx.rank() && axes.iter().enumerate().all(|(i, &a)| i == a);
    if op == ReduceOp::Sum && leading && lx.is_contiguous() {
        let rows = numel(&lx.shape()[..axes.len()]);
        sum_leading(&x[lx.offset()..lx.offset() + lx.numel()], rows, out);
        return;
    }
    let split = |keep: bool| -> Layout {
        let (mut shape, mut strides) = (vec![], vec![]);
        for a in 0..lx.rank() {
            if axes.contains(&a) != keep {
                shape.push(lx.shape()[a]);
                strides.push(lx.strides()[a]);
            }
        }
        Layout::new(shape, strides, 0)
    };
    let (kept, mut red) = (split(true), split(false));
    let kept = Layout::new(kept.shape().to_vec(), kept.strides().to_vec(), lx.offset());
    if red.rank() == 0 {
        red = Layout::new(vec![1], vec![0], 0);
    }
    let inner = *red.shape().last().unwrap_or(&1);
    let stride = *red.strides().last().unwrap_or(&0);
    let count = red.numel();
    let one = |o: usize| -> f32 {
        let base = kept.index_of(o);
        let mut acc = match op {
            ReduceOp::Sum => 0.0f32,
            ReduceOp::Max => f32::NEG_INFINITY,
        };
        if inner == 0 {
            return acc;
        }
        for r in 0..count / inner {
            let rb = base + red.index_of(r * inner);
            for j in 0..inner {
                let v = x[rb + j * stride].to_f32();
                acc = match op {
                    ReduceOp::Sum => acc + v,
                    ReduceOp::Max => acc.max(v),
                };
            }
        }
        acc
    };
    let per_task = ((1 << 14) / count.max(1)).max(1);
    out.par_chunks_mut(per_task)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (i, o) in chunk.iter_mut().enumerate() {
                *o = T::from_f32(one(c * per_task + i));
            }
        });
}

/// `out[j] = Σ_r x[r·n + j]` over `rows` contiguous rows of `n = out.len()`, r ascending.
/// Parallel over column blocks, each with its own f32 accumulators.
fn sum_leading<T: Elem>(x: &[T], rows: usize, out: &mut [T]) {
    let n = out.len();
    let block = |j0: usize, o: &mut [T]| {
        let mut acc = vec![0.0f32; o.len()]; // one f32 per output column of this block
        wide(
            #[inline(always)]
            || {
                for r in 0..rows {
                    let xr = &x[r * n + j0..r * n + j0 + acc.len()];
                    for (a, &v) in acc.iter_mut().zip(xr) {
                        *a += v.to_f32();
                    }
                }
            },
        );
        for (o, a) in o.iter_mut().zip(acc) {
            *o = T::from_f32(a);
        }
    };
    if rows * n <= 1 << 14 {
        block(0, out);
        return;
    }
    let cols = column_block(n);
    out.par_chunks_mut(cols)
        .enumerate()
        .for_each(|(c, o)| block(c * cols, o));
}

/// Columns per task of a sum down the rows of an `n`-column matrix: about a quarter of n per
/// thread pair, at least 64 (a task then reads two or more whole cache lines of each row
/// instead of half of one, which left the hardware prefetcher a stride per 16 columns). The
/// split never changes a bit: every column still adds its rows in order on one thread.
pub(super) fn column_block(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    n.div_ceil(2 * threads).next_multiple_of(16).max(64)
}
