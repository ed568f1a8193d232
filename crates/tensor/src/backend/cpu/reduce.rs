//! Reductions over any set of axes: each output element sums (or maxes) its inputs in one
//! fixed row-major order in f32, so results do not depend on the thread count.
//!
//! Not for: row-wise fused kernels like softmax (see `rows`).

use crate::backend::ReduceOp;
use crate::dtype::Elem;
use crate::shape::Layout;
use rayon::prelude::*;

pub fn reduce<T: Elem>(x: &[T], lx: &Layout, axes: &[usize], op: ReduceOp, out: &mut [T]) {
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
