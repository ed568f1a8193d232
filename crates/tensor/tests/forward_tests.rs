//! Forward values of the ops against slow, obviously-correct references written here with
//! plain loops in f64.

use crate::common;

use common::{assert_close, device, ids, tensor, values};
use headroom_memory::Category;
use headroom_tensor::{DType, Tensor, rng};

/// C = A·B for row-major A (m, k), B (k, n).
fn naive_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum();
        }
    }
    c
}

#[test]
fn matmul_matches_naive_loops_across_gemm_paths() {
    let device = device();
    // Small (single-threaded gemm), and large enough for the parallel path (≥ 96³ MACs).
    for &(m, k, n) in &[(3, 4, 5), (130, 97, 101)] {
        let (a, b) = (values(m * k, 1, -1.0, 1.0), values(k * n, 2, -1.0, 1.0));
        let got = tensor(&device, &[m, k], &a)
            .matmul(&tensor(&device, &[k, n], &b))
            .unwrap();
        assert_close(
            &got.to_vec_f32().unwrap(),
            &naive_matmul(&a, &b, m, k, n),
            1e-4,
            1e-4,
            "matmul",
        );
    }
}

#[test]
fn batched_matmul_with_transposed_rhs_matches_naive_loops() {
    let device = device();
    let (bsz, m, k, n) = (3, 4, 6, 5);
    let a = values(bsz * m * k, 3, -1.0, 1.0);
    let bt = values(bsz * n * k, 4, -1.0, 1.0); // stored (B, N, K), used as (B, K, N)
    let got = tensor(&device, &[bsz, m, k], &a)
        .matmul(
            &tensor(&device, &[bsz, n, k], &bt)
                .transpose(-1, -2)
                .unwrap(),
        )
        .unwrap();
    let mut want = Vec::new();
    for bi in 0..bsz {
        let mut b = vec![0.0; k * n];
        for p in 0..k {
            for j in 0..n {
                b[p * n + j] = bt[bi * n * k + j * k + p];
            }
        }
        want.extend(naive_matmul(&a[bi * m * k..(bi + 1) * m * k], &b, m, k, n));
    }
    assert_close(&got.to_vec_f32().unwrap(), &want, 1e-5, 1e-5, "bmm");
}

#[test]
fn softmax_and_log_softmax_match_the_definition() {
    let device = device();
    let x = values(12, 5, -3.0, 3.0);
    let t = tensor(&device, &[3, 4], &x);
    let mut want_p = vec![];
    let mut want_lp = vec![];
    for r in 0..3 {
        let row: Vec<f64> = x[r * 4..(r + 1) * 4].iter().map(|&v| v as f64).collect();
        let z: f64 = row.iter().map(|v| v.exp()).sum();
        want_p.extend(row.iter().map(|v| v.exp() / z));
        want_lp.extend(row.iter().map(|v| v - z.ln()));
    }
    assert_close(
        &t.softmax().unwrap().to_vec_f32().unwrap(),
        &want_p,
        1e-6,
        1e-5,
        "softmax",
    );
    assert_close(
        &t.log_softmax().unwrap().to_vec_f32().unwrap(),
        &want_lp,
        1e-6,
        1e-5,
        "log_softmax",
    );
}

#[test]
fn layer_norm_and_rms_norm_match_the_definition() {
    let device = device();
    let (n, c) = (4, 7);
    let (x, w, b) = (
        values(n * c, 6, -2.0, 2.0),
        values(c, 7, 0.5, 1.5),
        values(c, 8, -1.0, 1.0),
    );
    let (tx, tw, tb) = (
        tensor(&device, &[n, c], &x),
        tensor(&device, &[c], &w),
        tensor(&device, &[c], &b),
    );
    let mut want_ln = vec![];
    let mut want_rms = vec![];
    for r in 0..n {
        let row: Vec<f64> = x[r * c..(r + 1) * c].iter().map(|&v| v as f64).collect();
        let mu = row.iter().sum::<f64>() / c as f64;
        let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / c as f64;
        let ms = row.iter().map(|v| v * v).sum::<f64>() / c as f64;
        for j in 0..c {
            want_ln.push((row[j] - mu) / (var + 1e-5).sqrt() * w[j] as f64 + b[j] as f64);
            want_rms.push(row[j] / (ms + 1e-5).sqrt() * w[j] as f64);
        }
    }
    assert_close(
        &tx.layer_norm(&tw, &tb, 1e-5).unwrap().to_vec_f32().unwrap(),
        &want_ln,
        1e-5,
        1e-4,
        "layer_norm",
    );
    assert_close(
        &tx.rms_norm(&tw, 1e-5).unwrap().to_vec_f32().unwrap(),
        &want_rms,
        1e-5,
        1e-4,
        "rms_norm",
    );
}

#[test]
fn activations_match_their_formulas() {
    let device = device();
    let x = values(20, 9, -3.0, 3.0);
    let t = tensor(&device, &[20], &x);
    let gelu: Vec<f64> = x
        .iter()
        .map(|&v| {
            let v = v as f64;
            0.5 * v
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh())
        })
        .collect();
    let silu: Vec<f64> = x
        .iter()
        .map(|&v| v as f64 / (1.0 + (-v as f64).exp()))
        .collect();
    let relu: Vec<f64> = x.iter().map(|&v| (v as f64).max(0.0)).collect();
    assert_close(
        &t.gelu().unwrap().to_vec_f32().unwrap(),
        &gelu,
        1e-6,
        1e-5,
        "gelu",
    );
    assert_close(
        &t.silu().unwrap().to_vec_f32().unwrap(),
        &silu,
        1e-6,
        1e-5,
        "silu",
    );
    assert_close(
        &t.relu().unwrap().to_vec_f32().unwrap(),
        &relu,
        0.0,
        0.0,
        "relu",
    );
}

#[test]
fn sums_over_axes_of_a_permuted_tensor() {
    // x (2, 3, 4) with x[i, j, k] = 100i + 10j + k; permuted to (4, 2, 3) and summed over the
    // last axis: out[k, i] = Σ_j (100i + 10j + k) = 300i + 30 + 3k.
    let device = device();
    let x: Vec<f32> = (0..24)
        .map(|l| (100 * (l / 12) + 10 * ((l / 4) % 3) + l % 4) as f32)
        .collect();
    let t = tensor(&device, &[2, 3, 4], &x).permute(&[2, 0, 1]).unwrap();
    let got = t.sum(&[2]).unwrap();
    assert_eq!(got.shape(), &[4, 2]);
    let want: Vec<f64> = (0..8)
        .map(|l| (300 * (l % 2) + 30 + 3 * (l / 2)) as f64)
        .collect();
    assert_close(&got.to_vec_f32().unwrap(), &want, 0.0, 0.0, "sum");
    // max over axes 0 and 2 of x: for each j the max is at i = 1, k = 3: 100 + 10j + 3.
    let m = tensor(&device, &[2, 3, 4], &x).max(&[0, 2]).unwrap();
    assert_eq!(m.to_vec_f32().unwrap(), vec![103.0, 113.0, 123.0]);
}

#[test]
fn embedding_cat_narrow_and_causal_mask_values() {
    let device = device();
    // Table rows are [10r, 10r + 1]; ids [2, 0, 2] pick rows 2, 0, 2.
    let table = tensor(&device, &[3, 2], &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
    let e = table.embedding(&ids(&device, &[3], &[2, 0, 2])).unwrap();
    assert_eq!(
        e.to_vec_f32().unwrap(),
        vec![20.0, 21.0, 0.0, 1.0, 20.0, 21.0]
    );
    let c = Tensor::cat(&[&table, &table.narrow(0, 1, 1).unwrap()], 0).unwrap();
    assert_eq!(
        c.to_vec_f32().unwrap(),
        vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0, 10.0, 11.0]
    );
    let m = tensor(&device, &[2, 2], &[1.0, 2.0, 3.0, 4.0])
        .causal_mask()
        .unwrap()
        .to_vec_f32()
        .unwrap();
    assert_eq!(m[0], 1.0);
    assert_eq!(m[1], f32::NEG_INFINITY);
    assert_eq!(&m[2..], &[3.0, 4.0]);
}

#[test]
fn dropout_drops_about_p_and_scales_the_rest() {
    let device = device();
    rng::manual_seed(7);
    let n = 100_000;
    let y = Tensor::full(&device, &[n], 1.0, DType::F32, Category::Input, None)
        .unwrap()
        .dropout(0.25)
        .unwrap();
    let v = y.to_vec_f32().unwrap();
    // Kept elements are scaled by 1/(1 − 0.25) = 4/3; the dropped fraction has standard error
    // √(0.25·0.75/n) ≈ 0.0014.
    let dropped = v.iter().filter(|&&x| x == 0.0).count() as f64 / n as f64;
    assert!((dropped - 0.25).abs() < 0.01, "{dropped}");
    assert!(v.iter().all(|&x| x == 0.0 || (x - 4.0 / 3.0).abs() < 1e-6));
    // The cursor advanced by n: the next draw is a different mask.
    assert_eq!(rng::get_state().offset, n as u64);
}

#[test]
fn same_dtype_copies_move_bits_unchanged() {
    // A (2, 3, 4, 5) bf16 tensor whose bits are 0, 1, 2, … with a signalling NaN (0x7F81) and
    // a subnormal (0x0001) among them, permuted to (2, 4, 3, 5) and made contiguous: element
    // (a, b, c, d) of the copy must hold the bits at (a, c, b, d) of the source, the NaN not
    // quieted (a round trip through f32 would set its 0x0040 bit).
    let device = device();
    let x = Tensor::zeros(
        &device,
        &[2, 3, 4, 5],
        DType::BF16,
        Category::Activation,
        None,
    )
    .unwrap();
    x.with_slice_mut::<half::bf16, _>(|s| {
        for (i, v) in s.iter_mut().enumerate() {
            *v = half::bf16::from_bits(match i {
                7 => 0x7F81,
                8 => 0x0001,
                _ => i as u16,
            });
        }
    })
    .unwrap();
    let y = x.permute(&[0, 2, 1, 3]).unwrap().contiguous().unwrap();
    let got = y.with_slice::<half::bf16, _>(|s| s.to_vec()).unwrap();
    let src = x.with_slice::<half::bf16, _>(|s| s.to_vec()).unwrap();
    for a in 0..2 {
        for b in 0..4 {
            for c in 0..3 {
                for d in 0..5 {
                    let want = src[((a * 3 + c) * 4 + b) * 5 + d].to_bits();
                    let have = got[((a * 4 + b) * 3 + c) * 5 + d].to_bits();
                    assert_eq!(have, want, "({a}, {b}, {c}, {d})");
                }
            }
        }
    }
    assert!(
        got.iter().any(|v| v.to_bits() == 0x7F81),
        "the NaN kept its bits"
    );
}
