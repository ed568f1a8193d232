//! Index and mask kernels: embedding lookup and its scatter-add, gather/scatter of one element
//! per row (cross-entropy's target pick), counter-based dropout and the causal mask. Index
//! values are checked; an out-of-range id is an error, not a panic.
//!
//! Not for: general strided copies (see `elementwise`).

use crate::dtype::Elem;
use crate::error::{Result, TensorError};
use crate::rng;
use rayon::prelude::*;

/// Index tensors as i64, whatever their integer dtype.
pub enum Ids<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl Ids<'_> {
    pub fn len(&self) -> usize {
        match self {
            Ids::I32(v) => v.len(),
            Ids::I64(v) => v.len(),
        }
    }

    fn get(&self, i: usize) -> i64 {
        match self {
            Ids::I32(v) => v[i] as i64,
            Ids::I64(v) => v[i],
        }
    }

    /// The id at `i` as a row index below `size`.
    pub fn checked(&self, op: &'static str, i: usize, size: usize) -> Result<usize> {
        let id = self.get(i);
        if id < 0 || id as usize >= size {
            return Err(TensorError::IndexOutOfRange {
                op,
                index: id,
                size,
            });
        }
        Ok(id as usize)
    }

    fn check_all(&self, op: &'static str, size: usize) -> Result<()> {
        (0..self.len()).try_for_each(|i| self.checked(op, i, size).map(|_| ()))
    }
}

pub fn embedding<T: Elem>(
    table: &[T],
    rows: usize,
    ids: &Ids,
    c: usize,
    out: &mut [T],
) -> Result<()> {
    ids.check_all("embedding", rows)?;
    if c == 0 {
        return Ok(());
    }
    out.par_chunks_mut(c).enumerate().for_each(|(n, o)| {
        let id = ids.get(n) as usize;
        o.copy_from_slice(&table[id * c..(id + 1) * c]);
    });
    Ok(())
}

/// Scatter-add in order of `n` into an f32 accumulator, then stored in the table's dtype.
pub fn embedding_backward<T: Elem>(
    ids: &Ids,
    dy: &[T],
    c: usize,
    acc: &mut [f32],
    dtable: &mut [T],
) -> Result<()> {
    let rows = acc.len() / c.max(1);
    ids.check_all("embedding backward", rows)?;
    acc.fill(0.0);
    for n in 0..ids.len() {
        let id = ids.get(n) as usize;
        for (a, g) in acc[id * c..(id + 1) * c]
            .iter_mut()
            .zip(&dy[n * c..(n + 1) * c])
        {
            *a += g.to_f32();
        }
    }
    for (d, &a) in dtable.iter_mut().zip(acc.iter()) {
        *d = T::from_f32(a);
    }
    Ok(())
}

pub fn gather_last<T: Elem>(x: &[T], v: usize, idx: &Ids, out: &mut [T]) -> Result<()> {
    idx.check_all("gather", v)?;
    for (n, o) in out.iter_mut().enumerate() {
        *o = x[n * v + idx.get(n) as usize];
    }
    Ok(())
}

pub fn scatter_last<T: Elem>(idx: &Ids, dy: &[T], v: usize, out: &mut [T]) -> Result<()> {
    idx.check_all("scatter", v)?;
    out.fill(T::from_f32(0.0));
    for (n, g) in dy.iter().enumerate() {
        out[n * v + idx.get(n) as usize] = *g;
    }
    Ok(())
}

pub fn dropout<T: Elem>(x: &[T], p: f32, seed: u64, offset: u64, out: &mut [T]) {
    let scale = 1.0 / (1.0 - p);
    out.par_chunks_mut(1 << 14)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (i, o) in chunk.iter_mut().enumerate() {
                let at = c * (1 << 14) + i;
                let keep = rng::uniform(seed, offset + at as u64) >= p;
                *o = T::from_f32(if keep { x[at].to_f32() * scale } else { 0.0 });
            }
        });
}

pub fn causal_mask<T: Elem>(x: &[T], rows: usize, cols: usize, fill: f32, out: &mut [T]) {
    if cols == 0 {
        return;
    }
    out.par_chunks_mut(cols).enumerate().for_each(|(r, o)| {
        // Row i keeps columns 0..=i and fills the rest.
        let keep = (r % rows.max(1) + 1).min(cols);
        o[..keep].copy_from_slice(&x[r * cols..r * cols + keep]);
        o[keep..].fill(T::from_f32(fill));
    });
}
