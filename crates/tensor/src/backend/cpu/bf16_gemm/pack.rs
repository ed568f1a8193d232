//! Packing for the native bf16 GEMM: strided bf16 operands copied once per call into the
//! "pair" layouts the micro-kernel reads with plain vector loads. One dword holds the bf16
//! values of two consecutive k (k = 2p in the low half, 2p + 1 in the high half), the operand
//! form of `VDPBF16PS`. An odd k leaves the last pair's high half zero, and rows or columns past
//! the matrix edge are zero, so the kernel always runs whole 6×64 tiles.
//!
//! - A (m × k) becomes slivers of `MR` rows: sliver s, pair p, row r at `(s·pairs + p)·MR + r`.
//! - B (k × n) becomes panels of `NR` columns: panel j, pair p, column c at
//!   `(j·pairs + p)·NR + c`. Rows of a k block are therefore contiguous in both.
//!
//! Each operand has a fast path for unit stride along k or along its other dim (row-major and
//! transposed tensors); any other stride (broadcasts, narrowed views) goes element by element.
//!
//! Not for: arithmetic or threads.

use super::{MR, NR};

/// A strided matrix view over bf16 bits: element (i, j) is `data[off + i·rs + j·cs]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Strided<'a> {
    pub data: &'a [u16],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

impl Strided<'_> {
    fn at(&self, i: usize, j: usize) -> u16 {
        self.data[self.off + i * self.rs + j * self.cs]
    }
}

/// Two bf16 bit patterns as one dword: `lo` (even k) in bits 0..16, `hi` (odd k) above.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    lo as u32 | (hi as u32) << 16
}

/// Packs sliver `s` of `a` (m × k) into `dst` (`pairs·MR` dwords).
pub(super) fn pack_a(a: Strided, m: usize, k: usize, s: usize, dst: &mut [u32]) {
    let (r0, rows) = (s * MR, MR.min(m - s * MR));
    if rows < MR {
        dst.fill(0);
    }
    let full = k / 2;
    if a.cs == 1 {
        // Row-major rows: each k-pair is one unaligned dword of the source row.
        for r in 0..rows {
            let start = a.off + (r0 + r) * a.rs;
            let row = &a.data[start..start + k];
            for (p, two) in row.chunks_exact(2).enumerate() {
                dst[p * MR + r] = pair(two[0], two[1]);
            }
            if k % 2 == 1 {
                dst[full * MR + r] = pair(row[k - 1], 0);
            }
        }
    } else if a.rs == 1 {
        // Transposed (column-major): the sliver's rows are contiguous for each k.
        for p in 0..k.div_ceil(2) {
            let lo = &a.data[a.off + 2 * p * a.cs + r0..][..rows];
            let out = &mut dst[p * MR..p * MR + rows];
            if 2 * p + 1 < k {
                let hi = &a.data[a.off + (2 * p + 1) * a.cs + r0..][..rows];
                for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
                    *o = pair(l, h);
                }
            } else {
                for (o, &l) in out.iter_mut().zip(lo) {
                    *o = pair(l, 0);
                }
            }
        }
    } else {
        for p in 0..k.div_ceil(2) {
            for r in 0..rows {
                let hi = if 2 * p + 1 < k {
                    a.at(r0 + r, 2 * p + 1)
                } else {
                    0
                };
                dst[p * MR + r] = pair(a.at(r0 + r, 2 * p), hi);
            }
        }
    }
}

/// Packs panel `j` of `b` (k × n) into `dst` (`pairs·NR` dwords).
pub(super) fn pack_b(b: Strided, k: usize, n: usize, j: usize, dst: &mut [u32]) {
    let (c0, cols) = (j * NR, NR.min(n - j * NR));
    if cols < NR {
        dst.fill(0);
    }
    let full = k / 2;
    if b.cs == 1 {
        // Row-major (k × n): interleave two source rows of `cols` contiguous values.
        for p in 0..k.div_ceil(2) {
            let lo = &b.data[b.off + 2 * p * b.rs + c0..][..cols];
            let out = &mut dst[p * NR..p * NR + cols];
            if 2 * p + 1 < k {
                let hi = &b.data[b.off + (2 * p + 1) * b.rs + c0..][..cols];
                for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
                    *o = pair(l, h);
                }
            } else {
                for (o, &l) in out.iter_mut().zip(lo) {
                    *o = pair(l, 0);
                }
            }
        }
    } else if b.rs == 1 {
        // Transposed (a weight read as Wᵀ): each column is contiguous along k.
        for c in 0..cols {
            let start = b.off + (c0 + c) * b.cs;
            let col = &b.data[start..start + k];
            for (p, two) in col.chunks_exact(2).enumerate() {
                dst[p * NR + c] = pair(two[0], two[1]);
            }
            if k % 2 == 1 {
                dst[full * NR + c] = pair(col[k - 1], 0);
            }
        }
    } else {
        for p in 0..k.div_ceil(2) {
            for c in 0..cols {
                let hi = if 2 * p + 1 < k {
                    b.at(2 * p + 1, c0 + c)
                } else {
                    0
                };
                dst[p * NR + c] = pair(b.at(2 * p, c0 + c), hi);
            }
        }
    }
}
