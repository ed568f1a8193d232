//! Row-major walks over strided layouts: the storage offset of each row (a run of the last
//! axis), advanced odometer-style. `Layout::index_of` divides by every dim for each index; the
//! element kernels instead ask for the start of each row once and then step along the row with
//! the last axis's stride, which is 1 (a slice), 0 (a broadcast value) or anything else.
//!
//! Not for: the element loops themselves (see `elementwise`, `reduce`).

use crate::shape::Layout;

/// Storage offsets of consecutive rows of a layout, starting at a given row.
pub struct RowStarts<'a> {
    /// Shape and strides of the outer dims (all but the last axis).
    shape: &'a [usize],
    strides: &'a [usize],
    /// Multi-index of the current row over the outer dims.
    index: Vec<usize>,
    at: usize,
}

impl<'a> RowStarts<'a> {
    /// Rows of `layout` from row `first` (row = linear index / last-axis length).
    pub fn new(layout: &'a Layout, first: usize) -> RowStarts<'a> {
        let outer = layout.rank().saturating_sub(1);
        let (shape, strides) = (&layout.shape()[..outer], &layout.strides()[..outer]);
        let mut index = vec![0; outer];
        let (mut rest, mut at) = (first, layout.offset());
        for d in (0..outer).rev() {
            if shape[d] == 0 {
                break;
            }
            index[d] = rest % shape[d];
            at += index[d] * strides[d];
            rest /= shape[d];
        }
        RowStarts {
            shape,
            strides,
            index,
            at,
        }
    }

    /// The current row's storage offset; moves to the next row.
    #[inline]
    pub fn next_start(&mut self) -> usize {
        let start = self.at;
        for d in (0..self.shape.len()).rev() {
            self.index[d] += 1;
            self.at += self.strides[d];
            if self.index[d] < self.shape[d] {
                return start;
            }
            self.at -= self.index[d] * self.strides[d];
            self.index[d] = 0;
        }
        start
    }
}

/// Length and stride of the last axis (`(1, 0)` for a scalar layout).
pub fn inner_dim(layout: &Layout) -> (usize, usize) {
    match (layout.shape().last(), layout.strides().last()) {
        (Some(&d), Some(&s)) => (d, s),
        _ => (1, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_starts_match_index_of_for_permuted_and_broadcast_layouts() {
        let permuted = Layout::contiguous(&[2, 3, 4, 5])
            .permute(&[0, 2, 1, 3])
            .unwrap()
            .narrow(3, 1, 3)
            .unwrap();
        let broadcast = Layout::contiguous(&[5]).broadcast_to(&[2, 3, 5]).unwrap();
        for l in [permuted, broadcast] {
            let inner = *l.shape().last().unwrap();
            let rows = l.numel() / inner;
            for first in 0..rows {
                let mut walk = RowStarts::new(&l, first);
                for r in first..rows {
                    assert_eq!(walk.next_start(), l.index_of(r * inner), "{l:?} row {r}");
                }
            }
        }
    }
}
