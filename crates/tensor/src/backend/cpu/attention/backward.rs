//! The backward of the memory-efficient attention (see the parent module for the scheme):
//! each score tile is recomputed from q, k and the forward's row log-sum-exp `L`, with
//! `Dᵢ = dOᵢ·Oᵢ` computed once per row. dK and dV come from tasks that own a key block of one
//! key/value head and sum over the query heads of its group, then their query blocks; dQ from
//! tasks that own a query block and sum over key blocks, so every gradient element is written by
//! one task in a fixed order.
//!
//! Not for: the forward, the tiles or the task split (the parent module, `attention_tile`).

use super::super::attention_tile::{Mat, load_transposed, product, rows_of, transpose};
use super::super::math::fast_exp;
use super::super::simd::wide;
use super::super::{scratch_f32, slice, slice_mut, unsupported};
use super::{Bhtd, Rows, TILE, backward_per_lane, carve, group_of, keep, run_lanes, visible};
use crate::backend::{AttentionSpec, Dst, Src};
use crate::dtype::{Elem, with_float_type};
use crate::error::Result;
use headroom_memory::Device;
use rayon::prelude::*;

/// The probabilities of a (query block, key block) tile of head `g` and the score gradient,
/// in place: on entry `s` = scale·Q Kᵀ and `dp` = dO Vᵀ; on exit `s` = P ⊙ Z (dropout
/// multiplier Z) and `dp` = dS·scale = P ⊙ (Z ⊙ dP − D)·scale, zero where masked. `lse` and
/// `delta` hold L and D of the `t` rows of every head.
#[inline(always)]
fn probs_rows(
    spec: &AttentionSpec,
    (lse, delta, t): (&[f32], &[f32], usize),
    g: usize,
    (i0, rows): (usize, usize),
    (j0, cols): (usize, usize),
    s: &mut [f32],
    dp: &mut [f32],
) {
    for r in 0..rows {
        let i = i0 + r;
        let (lo, n) = visible(spec, i, j0, cols);
        let n = n.max(lo);
        let (li, di) = (lse[g * t + i], delta[g * t + i]);
        let (sr, dr) = (
            &mut s[r * TILE..r * TILE + cols],
            &mut dp[r * TILE..r * TILE + cols],
        );
        sr[lo..n].iter_mut().for_each(|x| *x = fast_exp(*x - li));
        if spec.dropout.is_some() {
            for c in lo..n {
                let z = keep(spec, t, g, i, j0 + c);
                dr[c] = sr[c] * (z * dr[c] - di) * spec.scale;
                sr[c] *= z;
            }
        } else {
            for (x, p) in dr[lo..n].iter_mut().zip(&sr[lo..n]) {
                *x = p * (*x - di) * spec.scale;
            }
        }
        sr[..lo].fill(0.0);
        dr[..lo].fill(0.0);
        sr[n..].fill(0.0);
        dr[n..].fill(0.0);
    }
}

/// One lane's backward workspace (`backward_per_lane`): six (TILE, D) tiles, then two
/// (TILE, TILE) score tiles.
fn tiles(buf: &mut [f32], d: usize) -> [&mut [f32]; 8] {
    let (t, s) = (TILE * d, TILE * TILE);
    carve(buf, [t, t, t, t, t, t, s, s])
}

/// Gradients of the attention whose forward saved `[q, k, v, o, lse]`, given dO: the
/// outputs asked for (dQ, dK, dV) are overwritten.
pub fn backward(
    saved: [&Src; 5],
    d_o: &Src,
    spec: &AttentionSpec,
    dq: Option<&mut Dst>,
    dk: Option<&mut Dst>,
    dv: Option<&mut Dst>,
) -> Result<()> {
    let [q, k, v, o, lse] = saved;
    let device = lse.buf.device().clone();
    let views = [q, k, v, o, d_o]
        .map(|x| Bhtd::src("attention_backward", x))
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let heads = q.layout.shape()[0] * views[0].h;
    let group = group_of("attention_backward", views[0], views[1])?;
    let (dq, dk, dv) = (grad_view(dq)?, grad_view(dk)?, grad_view(dv)?);
    let lse_all = &slice::<f32>(lse)?[lse.layout.offset()..];
    with_float_type!(q.dtype, T => {
        let ins = [q, k, v, o, d_o];
        let mut data: Vec<(&[T], Bhtd)> = Vec::with_capacity(5);
        for (x, l) in ins.iter().zip(&views) {
            data.push((slice::<T>(x)?, *l));
        }
        backward_typed::<T>(&device, &data, lse_all, (heads, group), spec, [out::<T>(dq)?, out::<T>(dk)?, out::<T>(dv)?])
    }, _ => Err(unsupported("attention_backward", q.dtype)))
}

/// A wanted gradient output with its checked view.
fn grad_view<'a, 'b>(g: Option<&'a mut Dst<'b>>) -> Result<Option<(Bhtd, &'a mut Dst<'b>)>> {
    g.map(|g| Ok((Bhtd::dst("attention_backward", g)?, g)))
        .transpose()
}

/// A wanted gradient output as rows for parallel tasks.
fn out<'a, T: Elem>(g: Option<(Bhtd, &'a mut Dst<'_>)>) -> Result<Option<(Bhtd, Rows<'a, T>)>> {
    g.map(|(l, g)| Ok((l, Rows::new(slice_mut::<T>(g)?))))
        .transpose()
}

/// `data` holds q, k, v, o, dO; `grads` the dQ, dK, dV outputs wanted.
fn backward_typed<T: Elem>(
    device: &Device,
    data: &[(&[T], Bhtd)],
    lse: &[f32],
    (heads, group): (usize, usize),
    spec: &AttentionSpec,
    grads: [Option<(Bhtd, Rows<'_, T>)>; 3],
) -> Result<()> {
    let [(q, lq), (k, lk), (v, lv), (o, lo), (d_o, ldo)] =
        [0, 1, 2, 3, 4].map(|i| (data[i].0, data[i].1));
    let (t, d) = (lq.t, lq.d);
    let nb = t.div_ceil(TILE);
    if heads * nb == 0 {
        return Ok(());
    }
    // Dᵢ = dOᵢ·Oᵢ, the row term of the softmax derivative: (B·H·T,) f32.
    let mut delta = scratch_f32(device, heads * t, "attention.delta")?;
    delta
        .slice_mut()
        .par_chunks_mut(t)
        .enumerate()
        .for_each(|(g, dg)| {
            for (i, di) in dg.iter_mut().enumerate() {
                let (a, b) = (ldo.row(g, i), lo.row(g, i));
                let mut acc = [0f32; 8];
                for c in 0..d {
                    acc[c % 8] += d_o[a + c].to_f32() * o[b + c].to_f32();
                }
                *di = ((acc[0] + acc[4]) + (acc[1] + acc[5]))
                    + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
            }
        });
    let delta = &*delta.slice_mut();
    let [dq, dk, dv] = grads;
    let scale = spec.scale;

    // P and dS of a (query block, key block) tile, in place (`probs_rows`).
    let probs = |g: usize, (i0, rows), (j0, cols), s: &mut [f32], dp: &mut [f32]| {
        // Its own AVX-512 body: a closure called from two tasks may stay out of line.
        wide(
            #[inline(always)]
            || probs_rows(spec, (lse, delta, t), g, (i0, rows), (j0, cols), s, dp),
        )
    };

    // dK and dV: one task per key block of a key/value head, summing over the query heads of
    // its group and, for each, over query blocks from the diagonal (causal).
    if dk.is_some() || dv.is_some() {
        run_lanes(
            device,
            backward_per_lane(d),
            heads / group * nb,
            #[inline(always)]
            |task, buf| {
                let [kt, vt, dkt, dvt, qt, dot_, s, dp] = tiles(buf, d);
                let (gk, kb) = (task / nb, task % nb);
                let j0 = kb * TILE;
                let cols = TILE.min(t - j0);
                load_transposed(k, |c| lk.row(gk, j0 + c), (cols, d), kt, TILE); // Kᵀ (D, cols)
                load_transposed(v, |c| lv.row(gk, j0 + c), (cols, d), vt, TILE); // Vᵀ (D, cols)
                let (ktm, vtm) = (Mat::new(kt, d, cols, TILE), Mat::new(vt, d, cols, TILE));
                dkt.fill(0.0);
                dvt.fill(0.0);
                let first_query_block = if spec.causal { kb } else { 0 };
                for (g, qb) in (gk * group..(gk + 1) * group)
                    .flat_map(|g| (first_query_block..nb).map(move |qb| (g, qb)))
                {
                    let i0 = qb * TILE;
                    let rows = TILE.min(t - i0);
                    let qm = rows_of(q, (lq.row(g, i0), lq.st), (rows, d), &mut *qt);
                    let dom = rows_of(d_o, (ldo.row(g, i0), ldo.st), (rows, d), &mut *dot_);
                    product(s, TILE, false, (qm, false), ktm, scale); // S (rows, cols)
                    product(dp, TILE, false, (dom, false), vtm, 1.0); // dP (rows, cols)
                    probs(g, (i0, rows), (j0, cols), s, dp);
                    let (pm, dsm) = (
                        Mat::new(s, rows, cols, TILE),
                        Mat::new(dp, rows, cols, TILE),
                    );
                    product(dvt, d, true, (pm, true), dom, 1.0); // dV += (P⊙Z)ᵀ dO
                    product(dkt, d, true, (dsm, true), qm, 1.0); // dK += dSᵀ Q · scale
                }
                for c in 0..cols {
                    // SAFETY: rows j0..j0 + cols of key/value head gk belong to this task only.
                    unsafe {
                        if let Some((l, out)) = &dk {
                            out.store(l.row(gk, j0 + c), &dkt[c * d..(c + 1) * d], 1.0);
                        }
                        if let Some((l, out)) = &dv {
                            out.store(l.row(gk, j0 + c), &dvt[c * d..(c + 1) * d], 1.0);
                        }
                    }
                }
            },
        )?;
    }

    // dQ: one task per query block, summing over the visible key blocks.
    if let Some((l_dq, dq)) = dq {
        run_lanes(
            device,
            backward_per_lane(d),
            heads * nb,
            #[inline(always)]
            |task, buf| {
                let [qt, dot_, kt, ktt, vt, dqt, s, dp] = tiles(buf, d);
                let (g, i0) = (task / nb, (task % nb) * TILE);
                let gk = g / group; // the key/value head of query head g
                let rows = TILE.min(t - i0);
                let qm = rows_of(q, (lq.row(g, i0), lq.st), (rows, d), qt);
                let dom = rows_of(d_o, (ldo.row(g, i0), ldo.st), (rows, d), dot_);
                dqt.fill(0.0);
                let key_end = if spec.causal { i0 + rows } else { t };
                for j0 in (0..key_end).step_by(TILE) {
                    let cols = TILE.min(t - j0);
                    let km = rows_of(k, (lk.row(gk, j0), lk.st), (cols, d), &mut *kt); // K (cols, D)
                    transpose(km, ktt, TILE); // Kᵀ (D, cols)
                    load_transposed(v, |c| lv.row(gk, j0 + c), (cols, d), vt, TILE); // Vᵀ (D, cols)
                    let (ktm, vtm) = (Mat::new(ktt, d, cols, TILE), Mat::new(vt, d, cols, TILE));
                    product(s, TILE, false, (qm, false), ktm, scale);
                    product(dp, TILE, false, (dom, false), vtm, 1.0);
                    probs(g, (i0, rows), (j0, cols), s, dp);
                    let dsm = Mat::new(dp, rows, cols, TILE);
                    product(dqt, d, true, (dsm, false), km, 1.0); // dQ += dS K · scale
                }
                for r in 0..rows {
                    // SAFETY: rows i0..i0 + rows of head g belong to this task only.
                    unsafe { dq.store(l_dq.row(g, i0 + r), &dqt[r * d..(r + 1) * d], 1.0) };
                }
            },
        )?;
    }
    Ok(())
}
