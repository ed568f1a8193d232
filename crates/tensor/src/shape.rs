//! Shapes and layouts: a `Layout` is a shape, element strides and an element offset into a
//! storage. Views (transpose, permute, narrow, broadcast, reshape of contiguous data) are layout
//! changes only; kernels read any layout.
//!
//! Not for: data or dtypes (see `storage`, `dtype`). Strides are never negative.

use crate::error::{Result, TensorError};

/// Number of elements of a shape (1 for a scalar shape `[]`).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major strides of a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// NumPy broadcasting of two shapes, aligned on the right.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(TensorError::ShapeMismatch {
                    op,
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                });
            }
        };
    }
    Ok(out)
}

/// Resolves a possibly negative axis against a rank.
pub fn resolve_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let a = if axis < 0 { axis + rank as isize } else { axis };
    if a < 0 || a as usize >= rank {
        return Err(TensorError::invalid(
            op,
            format!("axis {axis} is out of range for rank {rank}"),
        ));
    }
    Ok(a as usize)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl Layout {
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    pub fn new(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Layout {
        Layout {
            shape,
            strides,
            offset,
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Row-major contiguous (dimensions of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// One past the largest element index this layout touches (0 when empty).
    pub fn storage_extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// Storage index of the element at a row-major linear index.
    pub fn index_of(&self, mut linear: usize) -> usize {
        let mut at = self.offset;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            at += (linear % d) * s;
            linear /= d;
        }
        at
    }

    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        let mut seen = vec![false; self.rank()];
        if perm.len() != self.rank()
            || perm
                .iter()
                .any(|&p| p >= self.rank() || std::mem::replace(&mut seen[p], true))
        {
            return Err(TensorError::invalid(
                "permute",
                format!("{perm:?} is not a permutation of {} axes", self.rank()),
            ));
        }
        Ok(Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        })
    }

    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Layout> {
        if axis >= self.rank() || start + len > self.shape[axis] {
            return Err(TensorError::invalid(
                "narrow",
                format!(
                    "range {start}..{} on axis {axis} of shape {:?}",
                    start + len,
                    self.shape
                ),
            ));
        }
        let mut l = self.clone();
        l.offset += start * self.strides[axis];
        l.shape[axis] = len;
        Ok(l)
    }

    /// A stride-0 view of this layout expanded to `target` (right-aligned broadcasting).
    pub fn broadcast_to(&self, target: &[usize]) -> Result<Layout> {
        let mismatch = || TensorError::ShapeMismatch {
            op: "broadcast",
            lhs: self.shape.clone(),
            rhs: target.to_vec(),
        };
        if target.len() < self.rank() {
            return Err(mismatch());
        }
        let lead = target.len() - self.rank();
        let mut strides = vec![0; target.len()];
        for i in 0..self.rank() {
            if self.shape[i] == target[lead + i] {
                strides[lead + i] = self.strides[i];
            } else if self.shape[i] != 1 {
                return Err(mismatch());
            }
        }
        Ok(Layout {
            shape: target.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// The same elements under a new shape; only for contiguous layouts.
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        if !self.is_contiguous() || numel(shape) != self.numel() {
            return None;
        }
        Some(Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: self.offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_aligns_on_the_right() {
        assert_eq!(
            broadcast_shapes("t", &[2, 1, 3], &[4, 1]).unwrap(),
            vec![2, 4, 3]
        );
        assert!(broadcast_shapes("t", &[2, 3], &[4, 3]).is_err());
    }

    #[test]
    fn transposed_layout_indexes_columns_first() {
        // A (2, 3) contiguous tensor transposed to (3, 2): element (i, j) is storage j*3 + i.
        let t = Layout::contiguous(&[2, 3]).permute(&[1, 0]).unwrap();
        let got: Vec<usize> = (0..6).map(|i| t.index_of(i)).collect();
        assert_eq!(got, vec![0, 3, 1, 4, 2, 5]);
        assert!(!t.is_contiguous());
    }
}
