//! The tiles of the memory-efficient attention (`attention.rs`): loading rows of a head into
//! f32 tiles, plain or transposed, and the tile products `C (+)= β · op(A) · B`.
//!
//! The products are small (at most [`TILE`](super::attention::TILE) rows and columns, depth D
//! or TILE) and their operands sit in a lane's scratch, in L1 or L2. On a CPU with AVX-512F
//! they run on a register-blocked micro-kernel that reads the tiles where they are: blocks of
//! up to 6 rows × 64 columns of C in 24 zmm accumulators; per step p of the depth it loads the
//! B row p (4 zmm), broadcasts A(r, p) for each of the 6 rows and issues 24 fused
//! multiply-adds, the BLIS micro-kernel scheme (Van Zee & van de Geijn, "BLIS: A Framework for
//! Rapidly Instantiating BLAS Functionality", ACM TOMS 2015) without its packing, which tiles
//! this size do not repay. A general GEMM (gemm, one thread) packs both operands on every
//! call; on these tiles its packing and dispatch took more time than its arithmetic. Without
//! AVX-512F the products run on gemm.
//!
//! B is always row-major (`k × n`, unit column stride): callers load a tile transposed when a
//! product needs `Xᵀ` on the right ([`load_transposed`], [`transpose`]). A may be read either
//! way, since its elements are broadcast one at a time.
//!
//! Every element of C is one sum over p in ascending order (a chain of fused multiply-adds from
//! zero), then `C = C₀ + β·sum`: the same bits on any thread and any run.
//!
//! Not for: the online softmax or the task split (`attention.rs`).

use crate::dtype::{DType, Elem};

/// A row-major f32 matrix in a tile buffer: `rows × cols`, row stride `ld`.
#[derive(Clone, Copy)]
pub(super) struct Mat<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    ld: usize,
}

impl<'a> Mat<'a> {
    pub(super) fn new(data: &'a [f32], rows: usize, cols: usize, ld: usize) -> Mat<'a> {
        assert!(
            rows == 0 || cols == 0 || (rows - 1) * ld + cols <= data.len(),
            "attention tile out of range"
        );
        Mat {
            data,
            rows,
            cols,
            ld,
        }
    }
}

/// `c = (accumulate ? c : 0) + beta · op(a) · b`, `op(a)` = `aᵀ` when `transpose_a`; `c` is
/// `m × n` with row stride `ldc`, `b` is `k × n`.
pub(super) fn product(
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    (a, transpose_a): (Mat, bool),
    b: Mat,
    beta: f32,
) {
    // Logical (m × k) · (k × n); A(r, p) at a.data[r·a_rs + p·a_cs].
    let (m, k, a_rs, a_cs) = if transpose_a {
        (a.cols, a.rows, 1, a.ld)
    } else {
        (a.rows, a.cols, a.ld, 1)
    };
    let n = b.cols;
    assert_eq!(k, b.rows, "attention tile product dims");
    if m == 0 || n == 0 {
        return;
    }
    assert!((m - 1) * ldc + n <= c.len(), "attention tile out of range");
    if k == 0 {
        if !accumulate {
            (0..m).for_each(|r| c[r * ldc..r * ldc + n].fill(0.0));
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked just above); `Mat::new` and the assertions
        // above keep A (m × k with strides a_rs, a_cs), B (k × n, row stride b.ld) and C
        // (m × n, row stride ldc) inside their slices; C is a `&mut` borrow, so it aliases
        // neither.
        unsafe {
            avx512::product(
                c.as_mut_ptr(),
                ldc,
                accumulate,
                (a.data.as_ptr(), a_rs, a_cs),
                (m, k, n),
                (b.data.as_ptr(), b.ld),
                beta,
            )
        };
        return;
    }
    // SAFETY: as above, every index of A, B and C with the given strides is inside its slice,
    // and C does not alias A or B.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            accumulate,
            a.data.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.data.as_ptr(),
            1,
            b.ld as isize,
            1.0f32,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Widens `rows` rows of `d` elements of `x`, row `r` starting at `start(r)`, into a
/// contiguous `(rows, d)` f32 tile.
pub(super) fn load<T: Elem>(
    x: &[T],
    start: impl Fn(usize) -> usize,
    (rows, d): (usize, usize),
    tile: &mut [f32],
) {
    for r in 0..rows {
        let s = start(r);
        for (o, v) in tile[r * d..(r + 1) * d].iter_mut().zip(&x[s..s + d]) {
            *o = v.to_f32();
        }
    }
}

/// `rows` rows of `d` elements of `x`, row `r` at `first + r · stride`, as a matrix: read where
/// they are when `T` is f32 (no copy, row stride `stride`), else widened into `tile` by
/// [`load`] (row stride `d`). The same values either way, so the same products.
pub(super) fn rows_of<'a, T: Elem>(
    x: &'a [T],
    (first, stride): (usize, usize),
    (rows, d): (usize, usize),
    tile: &'a mut [f32],
) -> Mat<'a> {
    if T::DTYPE == DType::F32 {
        let x: &[f32] = bytemuck::cast_slice(x);
        return Mat::new(&x[first..], rows, d, stride);
    }
    load(x, |r| first + r * stride, (rows, d), tile);
    Mat::new(tile, rows, d, d)
}

/// As [`load`], transposed: a `(d, rows)` tile of row stride `ld`, element (c, r) = x[start(r) + c].
pub(super) fn load_transposed<T: Elem>(
    x: &[T],
    start: impl Fn(usize) -> usize,
    (rows, d): (usize, usize),
    tile: &mut [f32],
    ld: usize,
) {
    if rows == 0 || d == 0 {
        return;
    }
    assert!(
        rows <= ld && (d - 1) * ld + rows <= tile.len(),
        "attention tile out of range"
    );
    #[cfg(target_arch = "x86_64")]
    if T::DTYPE == DType::F32 && rows >= 16 && d >= 16 && std::is_x86_feature_detected!("avx512f") {
        let x: &[f32] = bytemuck::cast_slice(x);
        let (full_rows, full_cols) = (rows / 16 * 16, d / 16 * 16);
        for r0 in (0..full_rows).step_by(16) {
            let starts: [usize; 16] = std::array::from_fn(|k| start(r0 + k));
            assert!(
                starts.iter().all(|&s| s + d <= x.len()),
                "attention row out of range"
            );
            for c0 in (0..full_cols).step_by(16) {
                // SAFETY: AVX-512F is present (checked above); rows `starts[k]..+d` are inside
                // `x` (asserted), c0 + 16 ≤ d, and (c0 + 15)·ld + r0 + 16 ≤ (d − 1)·ld + rows ≤
                // tile.len() (asserted above), so every load and store is in bounds.
                unsafe { avx512::transpose_block(x, &starts, c0, (tile, ld), r0) };
            }
            // Columns past the last full 16: element by element.
            for (k, &s) in starts.iter().enumerate() {
                for c in full_cols..d {
                    tile[c * ld + r0 + k] = x[s + c];
                }
            }
        }
        for r in full_rows..rows {
            let s = start(r);
            for (c, &v) in x[s..s + d].iter().enumerate() {
                tile[c * ld + r] = v;
            }
        }
        return;
    }
    for r in 0..rows {
        let s = start(r);
        for (c, v) in x[s..s + d].iter().enumerate() {
            tile[c * ld + r] = v.to_f32();
        }
    }
}

/// `dst (cols × rows, row stride ld_dst) = srcᵀ` for a `rows × cols` tile of row stride `ld_src`.
pub(super) fn transpose(src: Mat, dst: &mut [f32], ld_dst: usize) {
    let (rows, cols) = (src.rows, src.cols);
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        rows <= ld_dst && (cols - 1) * ld_dst + rows <= dst.len(),
        "attention tile out of range"
    );
    for r in 0..rows {
        for c in 0..cols {
            dst[c * ld_dst + r] = src.data[r * src.ld + c];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::test_values as values;

    /// `C₀ + β·op(A)·B` in f64, the same strides as `product`'s arguments.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        c0: &[f32],
        ldc: usize,
        accumulate: bool,
        (a, transpose_a): (Mat, bool),
        b: Mat,
        beta: f32,
        (m, k, n): (usize, usize, usize),
    ) -> Vec<f64> {
        let mut out = vec![0.0f64; m * n];
        for r in 0..m {
            for c in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    let x = if transpose_a {
                        a.data[p * a.ld + r]
                    } else {
                        a.data[r * a.ld + p]
                    };
                    s += x as f64 * b.data[p * b.ld + c] as f64;
                }
                let base = if accumulate {
                    c0[r * ldc + c] as f64
                } else {
                    0.0
                };
                out[r * n + c] = base + beta as f64 * s;
            }
        }
        out
    }

    #[test]
    fn products_match_the_f64_reference_on_ragged_tiles() {
        // m, k, n cover full 6 × 64 register blocks, ragged rows (1..5), ragged columns (a
        // masked last vector, a column count below 16) and depth 1.
        for &(m, k, n) in &[
            (6, 64, 64),
            (13, 7, 70),
            (5, 1, 3),
            (64, 64, 64),
            (1, 33, 17),
        ] {
            for &(transpose_a, accumulate) in &[(false, false), (true, true), (true, false)] {
                let ld_a = if transpose_a { m + 3 } else { k + 2 };
                let a_rows = if transpose_a { k } else { m };
                let a_cols = if transpose_a { m } else { k };
                let a_data = values(a_rows * ld_a, 1);
                let b_data = values(k * (n + 5), 2);
                let ldc = n + 1;
                let c0 = values(m * ldc, 3);
                let a = Mat::new(&a_data, a_rows, a_cols, ld_a);
                let b = Mat::new(&b_data, k, n, n + 5);
                let want = reference(&c0, ldc, accumulate, (a, transpose_a), b, 0.5, (m, k, n));
                let mut c = c0.clone();
                product(&mut c, ldc, accumulate, (a, transpose_a), b, 0.5);
                for r in 0..m {
                    for col in 0..n {
                        let (got, w) = (c[r * ldc + col] as f64, want[r * n + col]);
                        // k products of magnitude ≤ 1 summed in f32: |error| ≤ γ_k·k + ulp.
                        let bound = (k as f64 + 2.0) * f32::EPSILON as f64 * (k as f64 + 1.0);
                        assert!(
                            (got - w).abs() <= bound,
                            "{m}x{k}x{n} tA={transpose_a} acc={accumulate} ({r},{col}): {got} vs {w}"
                        );
                    }
                    // Columns past n (the padding of C's rows) are left alone.
                    if ldc > n {
                        assert_eq!(c[r * ldc + n].to_bits(), c0[r * ldc + n].to_bits());
                    }
                }
            }
        }
    }

    #[test]
    fn integer_products_are_exact_and_zero_depth_clears_or_keeps() {
        // Small integers: every partial sum is exact in f32, so any summation order must
        // give the exact product.
        let (m, k, n) = (7, 9, 40);
        let a_data: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b_data: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
        let (a, b) = (Mat::new(&a_data, m, k, k), Mat::new(&b_data, k, n, n));
        let mut c = vec![1.0f32; m * n];
        product(&mut c, n, true, (a, false), b, 2.0);
        for r in 0..m {
            for col in 0..n {
                let s: f32 = (0..k)
                    .map(|p| a_data[r * k + p] * b_data[p * n + col])
                    .sum();
                assert_eq!(c[r * n + col], 1.0 + 2.0 * s, "({r},{col})");
            }
        }
        let empty_a = Mat::new(&[], m, 0, 0);
        let empty_b = Mat::new(&[], 0, n, n);
        let mut kept = vec![3.0f32; m * n];
        product(&mut kept, n, true, (empty_a, false), empty_b, 1.0);
        assert!(kept.iter().all(|&x| x == 3.0));
        product(&mut kept, n, false, (empty_a, false), empty_b, 1.0);
        assert!(kept.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn loads_and_transposes_place_every_element() {
        let x: Vec<f32> = (0..40).map(|i| i as f32).collect();
        // Rows start at 0, 10, 20 (stride 10), 4 elements each.
        let mut plain = vec![0.0f32; 12];
        load(&x, |r| 10 * r, (3, 4), &mut plain);
        let mut t = vec![-1.0f32; 4 * 5];
        load_transposed(&x, |r| 10 * r, (3, 4), &mut t, 5);
        let mut t2 = vec![-1.0f32; 4 * 5];
        transpose(Mat::new(&plain, 3, 4, 4), &mut t2, 5);
        for r in 0..3 {
            for c in 0..4 {
                let v = (10 * r + c) as f32;
                assert_eq!(plain[r * 4 + c], v);
                assert_eq!(t[c * 5 + r], v);
                assert_eq!(t2[c * 5 + r], v);
            }
        }
        // The padding columns of the transposed tiles are untouched.
        assert!((0..4).all(|c| t[c * 5 + 3] == -1.0 && t2[c * 5 + 4] == -1.0));
    }

    #[test]
    fn wide_transposed_loads_place_every_element_of_ragged_tiles() {
        // 37 rows of 70 (two full 16-row blocks and 5 more; four full 16-column blocks and 6
        // more), rows 75 apart, into a tile of row stride 48: the register-transposed blocks
        // and the element-by-element edges together, as f32 and through the bf16 widening.
        let (rows, d, stride, ld) = (37, 70, 75, 48);
        let x: Vec<f32> = (0..rows * stride).map(|i| i as f32).collect();
        let mut t = vec![-1.0f32; d * ld];
        load_transposed(&x, |r| stride * r, (rows, d), &mut t, ld);
        let xb: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v % 256.0)).collect();
        let mut tb = vec![-1.0f32; d * ld];
        load_transposed(&xb, |r| stride * r, (rows, d), &mut tb, ld);
        for c in 0..d {
            for r in 0..rows {
                assert_eq!(t[c * ld + r], (stride * r + c) as f32, "({c}, {r})");
                assert_eq!(
                    tb[c * ld + r],
                    ((stride * r + c) % 256) as f32,
                    "bf16 ({c}, {r})"
                );
            }
            assert!((rows..ld).all(|r| t[c * ld + r] == -1.0 && tb[c * ld + r] == -1.0));
        }
    }
}
