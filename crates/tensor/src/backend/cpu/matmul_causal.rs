//! f32 products of causal attention that skip what the causal mask makes moot. Each `T × T`
//! matrix is taken in row panels of [`PANEL`] rows; a panel's product covers only the columns
//! (for scores, `LowerOut`) or the reduction range (for products with triangular
//! probabilities, `LowerLeft` and `UpperLeft`) that can be non-zero, so the six products of a
//! materialised causal attention do about `(n + 1) / 2n` of the full work for `n` panels (5/8
//! at `T = 256`). The reduction over a triangular operand stops where the operand's zeros
//! begin; every term it leaves out is `0 · x`, so each output is the full product's
//! multiply-add chain cut short of exact zeros. PyTorch's materialised attention (two
//! `matmul`s around a masked softmax) computes every product in full.
//!
//! Not for: general products (see `matmul`), or attention that never materialises the scores
//! (see `attention`).

use super::matmul::{Dims, for_each_product, gemm_f32, split};
use crate::backend::CausalProduct;
use crate::shape::Layout;

/// Rows of a panel: large enough for gemm's 64-row micro-kernel to run at its rate, small
/// enough that a sequence of 256 has four panels.
const PANEL: usize = 64;

/// Whether `d` has the square `T × T` side `kind` needs and more than one panel (else the
/// full product is as cheap).
pub fn causal_fits(d: &Dims, kind: CausalProduct) -> bool {
    let square = match kind {
        CausalProduct::LowerOut => d.m == d.n,
        CausalProduct::LowerLeft | CausalProduct::UpperLeft => d.m == d.k,
    };
    square && d.m > PANEL
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
        for r0 in (0..d.m)
            .step_by(PANEL)
            .take_while(|&r0| r0 == 0 || d.m - r0 >= PANEL / 2)
        {
            // A short last panel joins the one before: gemm takes other paths for a few rows.
            let r1 = if d.m - r0 < PANEL + PANEL / 2 {
                d.m
            } else {
                r0 + PANEL
            };
            // (columns, reduction length, a's and b's first element) of rows r0..r1.
            let (n, k, a0, b0) = match kind {
                CausalProduct::LowerOut => (r1, d.k, ao + r0 as isize * ars, bo),
                CausalProduct::LowerLeft => (d.n, r1, ao + r0 as isize * ars, bo),
                CausalProduct::UpperLeft => (
                    d.n,
                    d.k - r0,
                    ao + r0 as isize * (ars + acs),
                    bo + r0 as isize * brs,
                ),
            };
            // SAFETY: the panel's rows, columns and reduction range lie inside the full
            // product's, whose element offsets the layouts (built from these storages' shapes)
            // keep inside `a`, `b`; `o` is m×n row-major and the panel writes rows r0..r1.
            unsafe {
                gemm_f32(
                    [r1 - r0, n, k],
                    (o.as_mut_ptr().add(r0 * d.n), d.n),
                    ((ap as *const f32).offset(a0), ars, acs),
                    ((bp as *const f32).offset(b0), brs, bcs),
                    par,
                )
            }
        }
    });
}
