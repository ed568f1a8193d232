//! f32 products of causal attention that skip what the causal mask makes moot. Each `T × T`
//! matrix is taken in row panels of [`PANEL`] rows; a panel's product covers only the columns
//! (for scores, `LowerOut`) or the reduction range (for products with triangular
//! probabilities, `LowerLeft` and `UpperLeft`) that can be non-zero, so the six products of a
//! materialised causal attention do about `(n + 1) / 2n` of the full work for `n` panels (5/8
//! at `T = 256`). The reduction over a triangular operand stops where the operand's zeros
//! begin, so each output is the full product's multiply-add chain short of terms `0 · x`. Up
//! to `T = 512` (one reduction block in gemm) that is the full product's result bit for bit;
//! beyond, gemm rounds each 512-long block's partial sum apart, and a panel's shorter or
//! later-starting reduction puts the block edges elsewhere, so the results agree to rounding.
//! A non-finite entry no longer reaches the rows whose terms for it are skipped (the full
//! product spreads `0 · ∞ = NaN`). PyTorch's materialised attention (two `matmul`s around a
//! masked softmax) computes every product in full.
//!
//! Not for: general products (see `matmul`), or attention that never materialises the scores
//! (see `attention`).

use super::matmul::{Dims, for_each_product, gemm_f32, split};
use crate::backend::CausalProduct;
use crate::dtype::DType;
use crate::shape::Layout;

/// Rows of a panel: large enough for gemm's 64-row micro-kernel to run at its rate, small
/// enough that a sequence of 256 has four panels.
const PANEL: usize = 64;

/// Whether the CPU skips blocks of this product: f32 (other dtypes run the full product), the
/// square `T × T` side `kind` needs, more than one panel (else the full product is as cheap)
/// and something to compute. The dry run counts the same work (`backend::shape_only`).
pub fn causal_fits(dtype: DType, d: &Dims, kind: CausalProduct) -> bool {
    let square = match kind {
        CausalProduct::LowerOut => d.m == d.n,
        CausalProduct::LowerLeft | CausalProduct::UpperLeft => d.m == d.k,
    };
    dtype == DType::F32 && square && d.m > PANEL && d.n > 0 && d.k > 0
}

/// `out (batch, m, n) = a @ b` for the causal `kind`, on gemm with the operands' own strides.
/// Under `LowerOut` the entries above each panel's diagonal block are left as they were.
pub fn matmul_f32_causal(
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    out: &mut [f32],
    d: Dims,
    kind: CausalProduct,
) {
    let (ba, ars, acs) = split(la);
    let (bb, brs, bcs) = split(lb);
    let (ap, bp) = (a.as_ptr() as usize, b.as_ptr() as usize);
    for_each_product(out, &d, |i, o, par| {
        let (ao, bo) = (ba.index_of(i) as isize, bb.index_of(i) as isize);
        for Panel { rows, n, k } in panels(&d, kind) {
            let r0 = rows.start as isize;
            // a's and b's first elements for rows r0..: the reduction starts at 0, or at r0
            // under an upper-triangular left operand.
            let (a0, b0) = match kind {
                CausalProduct::LowerOut | CausalProduct::LowerLeft => (ao + r0 * ars, bo),
                CausalProduct::UpperLeft => (ao + r0 * (ars + acs), bo + r0 * brs),
            };
            // SAFETY: the panel's rows, columns and reduction range lie inside the full
            // product's, whose element offsets the layouts (built from these storages' shapes)
            // keep inside `a`, `b`; `o` is m×n row-major and the panel writes its rows.
            unsafe {
                gemm_f32(
                    [rows.len(), n, k],
                    (o.as_mut_ptr().add(rows.start * d.n), d.n),
                    ((ap as *const f32).offset(a0), ars, acs),
                    ((bp as *const f32).offset(b0), brs, bcs),
                    par,
                )
            }
        }
    });
}

/// One panel's product: output rows, columns from 0 and the reduction's length.
pub struct Panel {
    pub rows: std::ops::Range<usize>,
    pub n: usize,
    pub k: usize,
}

/// The panels of a causal product of geometry `d` (one that fits, [`causal_fits`]): rows in runs of
/// [`PANEL`], a short last run joined to the one before (gemm takes other paths for a few
/// rows); per panel the columns (`LowerOut`: up to the panel's last row) and the reduction
/// (`LowerLeft`: up to its last row; `UpperLeft`: from its first row to the end).
pub fn panels(d: &Dims, kind: CausalProduct) -> impl Iterator<Item = Panel> + use<> {
    let d = *d;
    (0..d.m)
        .step_by(PANEL)
        .take_while(move |&r0| r0 == 0 || d.m - r0 >= PANEL / 2)
        .map(move |r0| {
            let r1 = if d.m - r0 < PANEL + PANEL / 2 {
                d.m
            } else {
                r0 + PANEL
            };
            let (n, k) = match kind {
                CausalProduct::LowerOut => (r1, d.k),
                CausalProduct::LowerLeft => (d.n, r1),
                CausalProduct::UpperLeft => (d.n, d.k - r0),
            };
            Panel { rows: r0..r1, n, k }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::matmul::matmul_f32;
    use crate::backend::cpu::test_values as values;

    /// `batch` lower-triangular `t × t` matrices (zeros above the diagonal), row-major.
    fn lower(batch: usize, t: usize, seed: u64) -> Vec<f32> {
        let mut x = values(batch * t * t, seed);
        for (r, row) in x.chunks_mut(t).enumerate() {
            row[r % t + 1..].fill(0.0);
        }
        x
    }

    fn contiguous(batch: usize, rows: usize, cols: usize) -> Layout {
        Layout::contiguous(&[batch, rows, cols])
    }

    /// `batch` matrices of `rows × cols` stored as their `cols × rows` transposes.
    fn transposed(batch: usize, rows: usize, cols: usize) -> Layout {
        Layout::new(vec![batch, rows, cols], vec![rows * cols, 1, rows], 0)
    }

    /// The causal product and the full one on the same operands; entries the kind leaves
    /// unspecified (above the diagonal of a `LowerOut`) are compared as 0 on both sides.
    fn both(
        kind: CausalProduct,
        (a, la): (&[f32], &Layout),
        (b, lb): (&[f32], &Layout),
        d: Dims,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut got = vec![f32::NAN; d.batch * d.m * d.n];
        let mut want = vec![0.0; got.len()];
        matmul_f32_causal(a, la, b, lb, &mut got, d, kind);
        matmul_f32(a, la, b, lb, &mut want, d);
        if kind == CausalProduct::LowerOut {
            for (r, (g, w)) in got.chunks_mut(d.n).zip(want.chunks_mut(d.n)).enumerate() {
                g[r % d.m + 1..].fill(0.0);
                w[r % d.m + 1..].fill(0.0);
            }
        }
        (got, want)
    }

    /// Every kind on `batch` products of `T = t`, `D = width`.
    fn every_kind(
        batch: usize,
        t: usize,
        width: usize,
    ) -> Vec<(CausalProduct, Vec<f32>, Vec<f32>)> {
        let (q, k, x) = (
            values(batch * t * width, 1),
            values(batch * t * width, 2),
            values(batch * t * width, 3),
        );
        let p = lower(batch, t, 4);
        let tall = contiguous(batch, t, width);
        let square = contiguous(batch, t, t);
        let dims = |n, k| Dims { batch, m: t, n, k };
        vec![
            // q·kᵀ with kᵀ read through its transposed strides.
            {
                let (g, w) = both(
                    CausalProduct::LowerOut,
                    (&q, &tall),
                    (&k, &transposed(batch, width, t)),
                    dims(t, width),
                );
                (CausalProduct::LowerOut, g, w)
            },
            {
                let (g, w) = both(
                    CausalProduct::LowerLeft,
                    (&p, &square),
                    (&x, &tall),
                    dims(width, t),
                );
                (CausalProduct::LowerLeft, g, w)
            },
            // pᵀ·x with pᵀ read through its transposed strides.
            {
                let (g, w) = both(
                    CausalProduct::UpperLeft,
                    (&p, &transposed(batch, t, t)),
                    (&x, &tall),
                    dims(width, t),
                );
                (CausalProduct::UpperLeft, g, w)
            },
        ]
    }

    #[test]
    fn panels_cover_every_row_once_and_no_panel_is_short() {
        for m in [65, 90, 95, 96, 100, 127, 128, 129, 150, 160, 256, 1000] {
            let d = Dims {
                batch: 1,
                m,
                n: m,
                k: m,
            };
            let rows: Vec<_> = panels(&d, CausalProduct::LowerOut)
                .map(|p| p.rows)
                .collect();
            assert_eq!(rows[0].start, 0, "m {m}");
            assert_eq!(rows.last().unwrap().end, m, "m {m}");
            for w in rows.windows(2) {
                assert_eq!(w[0].end, w[1].start, "m {m}");
            }
            assert!(rows.iter().all(|r| r.len() >= PANEL / 2), "m {m}: {rows:?}");
        }
    }

    #[test]
    fn within_one_reduction_block_the_products_are_the_full_ones_bit_for_bit() {
        // One product on the pool (batch 1) and several side by side; D below, at and above
        // gemm's 64-column small-matrix path; T ragged against the 64-row panels.
        for (batch, t, width) in [(1, 256, 64), (3, 130, 8), (2, 100, 80), (1, 512, 16)] {
            for (kind, got, want) in every_kind(batch, t, width) {
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "{kind:?} batch {batch} T {t} D {width}");
            }
        }
    }

    #[test]
    fn past_one_reduction_block_they_agree_to_rounding() {
        // gemm splits reductions longer than 512 into blocks whose edges a panel's shorter or
        // later-starting reduction places elsewhere: each block's partial sum is rounded apart.
        for (batch, t, width) in [(1, 576, 64), (1, 1024, 128)] {
            for (kind, got, want) in every_kind(batch, t, width) {
                let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
                let err = got
                    .iter()
                    .zip(&want)
                    .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
                assert!(
                    err <= 1e-6 * scale,
                    "{kind:?} T {t} D {width}: {err} of {scale}"
                );
            }
        }
    }
}
