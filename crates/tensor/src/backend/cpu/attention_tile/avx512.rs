//! The AVX-512F register kernels of the attention tiles (`attention_tile`): the tile product
//! `C (+)= β · op(A) · B` in blocks of up to 6 rows × 64 columns held in 24 zmm accumulators (the
//! BLIS micro-kernel scheme without its packing), and the 16 × 16 block of a transposed tile
//! load.
//!
//! Not for: the dispatch, the scalar paths or the bounds checks (`attention_tile`).

use std::arch::x86_64::*;

/// Writes the 16 × 16 block of rows `starts[k] + c0..+16` of `x` transposed into
/// `tile[(c0 + j)·ld + r0..+16]`: sixteen row loads, the register transpose
/// (`simd::transpose16_ps`), sixteen stores.
///
/// # Safety
/// The CPU has AVX-512F; `starts[k] + c0 + 16 ≤ x.len()` for every k and
/// `(c0 + 15)·ld + r0 + 16 ≤ tile.len()`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose_block(
    x: &[f32],
    starts: &[usize; 16],
    c0: usize,
    (tile, ld): (&mut [f32], usize),
    r0: usize,
) {
    // SAFETY: row k's elements c0..c0 + 16 are inside `x` (the contract).
    let rows: [__m512; 16] =
        std::array::from_fn(|k| unsafe { _mm512_loadu_ps(x.as_ptr().add(starts[k] + c0)) });
    for (j, col) in super::super::simd::transpose16_ps(rows)
        .into_iter()
        .enumerate()
    {
        // SAFETY: (c0 + j)·ld + r0 + 16 ≤ tile.len() (the contract).
        unsafe { _mm512_storeu_ps(tile.as_mut_ptr().add((c0 + j) * ld + r0), col) };
    }
}

/// Rows of C per register block.
const MR: usize = 6;
/// Columns of C per register block (4 zmm of 16 f32).
const NR: usize = 64;

/// See [`super::product`]: C (m × n, row stride ldc), A(r, p) at `a + r·a_rs + p·a_cs`,
/// B (k × n) at `b`, row stride `ldb`.
///
/// # Safety
/// The CPU has AVX-512F; every element of A, B and C those shapes and strides name is
/// inside its allocation, C writable and aliasing neither A nor B; m, k, n > 0.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn product(
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    (a, a_rs, a_cs): (*const f32, usize, usize),
    (m, k, n): (usize, usize, usize),
    (b, ldb): (*const f32, usize),
    beta: f32,
) {
    let mut j = 0;
    while j < n {
        let w = (n - j).min(NR);
        // Lanes of the last zmm of this column block that hold columns of C.
        let last: __mmask16 = if w % 16 == 0 {
            0xffff
        } else {
            (1 << (w % 16)) - 1
        };
        let mut r = 0;
        while r < m {
            let rows = (m - r).min(MR);
            let block = Block {
                c: c.wrapping_add(r * ldc + j),
                ldc,
                accumulate,
                a: a.wrapping_add(r * a_rs),
                a_rs,
                a_cs,
                k,
                b: b.wrapping_add(j),
                ldb,
                last,
                beta,
            };
            // SAFETY: rows r..r + rows and columns j..j + w lie inside C, A's rows
            // r..r + rows and B's columns j..j + w inside A and B (the contract); the
            // block reads and writes no lane past column j + w (mask `last`).
            unsafe {
                match (rows, w.div_ceil(16)) {
                    (6, 4) => block.run::<6, 4>(),
                    (6, 3) => block.run::<6, 3>(),
                    (6, 2) => block.run::<6, 2>(),
                    (6, 1) => block.run::<6, 1>(),
                    (5, v) => block.run_rows::<5>(v),
                    (4, v) => block.run_rows::<4>(v),
                    (3, v) => block.run_rows::<3>(v),
                    (2, v) => block.run_rows::<2>(v),
                    (_, v) => block.run_rows::<1>(v),
                }
            }
            r += rows;
        }
        j += w;
    }
}

/// One register block: `R` rows × `V` zmm of C.
struct Block {
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    k: usize,
    b: *const f32,
    ldb: usize,
    last: __mmask16,
    beta: f32,
}

impl Block {
    /// # Safety
    /// As [`Block::run`].
    #[target_feature(enable = "avx512f")]
    unsafe fn run_rows<const R: usize>(&self, v: usize) {
        // SAFETY: forwarded contract.
        unsafe {
            match v {
                4 => self.run::<R, 4>(),
                3 => self.run::<R, 3>(),
                2 => self.run::<R, 2>(),
                _ => self.run::<R, 1>(),
            }
        }
    }

    /// `C[R × 16V] = (accumulate ? C : 0) + β · Σ_p A[·, p] B[p, ·]`, the last zmm of each
    /// row masked by `last`.
    ///
    /// # Safety
    /// The CPU has AVX-512F; the R rows of C, A's R rows over the k steps and B's k rows
    /// over 16(V − 1) columns plus the lanes of `last` are in bounds.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn run<const R: usize, const V: usize>(&self) {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let mask = |q: usize| if q + 1 == V { self.last } else { 0xffff };
        for p in 0..self.k {
            // SAFETY: row p < k of B, columns inside the block (contract, masked tail).
            let mut bv = [_mm512_setzero_ps(); V];
            for (q, x) in bv.iter_mut().enumerate() {
                *x = unsafe { _mm512_maskz_loadu_ps(mask(q), self.b.add(p * self.ldb + 16 * q)) };
            }
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: A(r, p) with r < R, p < k is in bounds (contract).
                let av = _mm512_set1_ps(unsafe { *self.a.add(r * self.a_rs + p * self.a_cs) });
                for (x, &bq) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(av, bq, *x);
                }
            }
        }
        let beta = _mm512_set1_ps(self.beta);
        for (r, row) in acc.iter().enumerate() {
            for (q, &x) in row.iter().enumerate() {
                // SAFETY: row r < R of C, the lanes of mask(q) inside the block (contract).
                unsafe {
                    let at = self.c.add(r * self.ldc + 16 * q);
                    let c0 = if self.accumulate {
                        _mm512_maskz_loadu_ps(mask(q), at)
                    } else {
                        _mm512_setzero_ps()
                    };
                    _mm512_mask_storeu_ps(at, mask(q), _mm512_fmadd_ps(beta, x, c0));
                }
            }
        }
    }
}
