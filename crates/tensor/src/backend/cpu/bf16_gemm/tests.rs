//! Every bf16 kernel (AMX tiles, native `VDPBF16PS`, f32 FMA on packed copies, the widening
//! fallback) against an independent reference: a plain triple loop in f64 over the same bf16
//! inputs, read through the layouts.
//!
//! Tolerance. bf16 × bf16 products are exact in f32 (8 + 8 significand bits ≤ 24), so the only
//! roundings are the k − 1 f32 additions, in any order, and the final bf16 rounding. With
//! `u = 2^-24` and `γ_k = k·u / (1 − k·u)` the f32 sum `s` obeys `|s − c| ≤ γ_k·S`, where `c`
//! is the exact dot product and `S = Σ|a_i·b_i|` (Higham, *Accuracy and Stability of Numerical
//! Algorithms*, 2nd ed., §3.1). Rounding to bf16 multiplies by `(1 + δ)`, `|δ| ≤ 2^-8`, so
//!
//! `|out − c| ≤ 2^-8·|c| + (1 + 2^-8)·γ_k·S + k·2^-126`,
//!
//! the last term covering the subnormal flushes of `VDPBF16PS` (never reached by these inputs,
//! which are normal numbers of magnitude 2^-6..2).
//!
//! The bound is dominated by the bf16 rounding of the output, so a term dropped or misplaced by
//! the packing could hide under it. Every case therefore also runs on small integers
//! (|x| ≤ 4): then every f32 partial sum is an exact integer, and the output must be exactly the
//! bf16 rounding of the exact result, bit for bit.

use super::{
    Bf16Gemm, amx, amx_supported, bf16_gemm, fma_bf16, fma_supported, native, native_supported,
};
use crate::backend::cpu::matmul::{Dims, matmul_widening};
use crate::shape::Layout;
use half::bf16;
use headroom_memory::{AllocatorConfig, Device};

/// What the operands hold.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Data {
    /// Mixed signs, magnitudes 2^-6..2: checked against the rounding bound.
    Floats,
    /// Integers −4..=4: every sum exact, so checked bit for bit.
    Integers,
}

/// Deterministic bf16 values of the given kind.
fn values(len: usize, seed: u64, data: Data) -> Vec<bf16> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let unit = (x >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            let exp = ((x >> 33) % 7) as i32 - 6; // 2^-6 .. 2^0
            let sign = if x >> 63 == 1 { -1.0 } else { 1.0 };
            match data {
                Data::Floats => bf16::from_f32(sign * (1.0 + unit) * 2f32.powi(exp)),
                Data::Integers => bf16::from_f32(((x >> 40) % 9) as f32 - 4.0),
            }
        })
        .collect()
}

/// How an operand (rows × cols per batch element) sits in its storage.
#[derive(Debug, Clone, Copy)]
enum Form {
    RowMajor,
    /// Stored as its transpose (cols × rows, row-major), as `x.transpose(-1, -2)` hands it in.
    Transposed,
    /// Every other column of a wider matrix, one element in: a narrowed, non-unit-stride view.
    EveryOther,
    /// The first columns of a wider row-major matrix, one element in, rows an odd number of
    /// elements apart: unit column stride but row stride ≠ cols, as a head view of a fused
    /// projection (read in place by the native kernel when k is even, at unaligned dwords).
    Narrowed,
    /// One matrix broadcast over the batch (batch stride 0).
    Broadcast,
}

/// Storage and a (batch, rows, cols) layout for an operand in `form`.
fn operand(
    batch: usize,
    rows: usize,
    cols: usize,
    form: Form,
    seed: u64,
    data: Data,
) -> (Vec<bf16>, Layout) {
    let shape = vec![batch, rows, cols];
    let (len, strides, off) = match form {
        Form::RowMajor => (batch * rows * cols, vec![rows * cols, cols, 1], 0),
        Form::Transposed => (batch * rows * cols, vec![rows * cols, 1, rows], 0),
        Form::EveryOther => {
            let width = 2 * cols + 1;
            (batch * rows * width + 1, vec![rows * width, width, 2], 1)
        }
        Form::Broadcast => (rows * cols, vec![0, cols, 1], 0),
        Form::Narrowed => {
            let width = cols + 3;
            (batch * rows * width + 1, vec![rows * width, width, 1], 1)
        }
    };
    (values(len, seed, data), Layout::new(shape, strides, off))
}

/// Checks `out` against the f64 reference: within the documented bound for `Floats`, exactly
/// for `Integers`. Returns the largest observed error as a fraction of the bound.
fn check(
    (a, la): (&[bf16], &Layout),
    (b, lb): (&[bf16], &Layout),
    out: &[bf16],
    d: Dims,
    data: Data,
) -> f64 {
    let at = |l: &Layout, s: &[bf16], i: usize, r: usize, c: usize| {
        let st = l.strides();
        s[l.offset() + i * st[0] + r * st[1] + c * st[2]].to_f64()
    };
    let u = 2f64.powi(-24);
    let gamma = d.k as f64 * u / (1.0 - d.k as f64 * u);
    let mut worst = 0.0f64;
    for i in 0..d.batch {
        for r in 0..d.m {
            for c in 0..d.n {
                let (mut exact, mut abs) = (0.0f64, 0.0f64);
                for kk in 0..d.k {
                    let p = at(la, a, i, r, kk) * at(lb, b, i, kk, c);
                    exact += p;
                    abs += p.abs();
                }
                let got = out[(i * d.m + r) * d.n + c].to_f64();
                if data == Data::Integers {
                    let want = bf16::from_f64(exact).to_f64();
                    assert_eq!(got, want, "batch {i} C[{r}][{c}], exact {exact} ({d:?})");
                    continue;
                }
                let bound = 2f64.powi(-8) * exact.abs()
                    + (1.0 + 2f64.powi(-8)) * gamma * abs
                    + d.k as f64 * 2f64.powi(-126);
                let err = (got - exact).abs();
                assert!(
                    err <= bound,
                    "batch {i} C[{r}][{c}] = {got}, exact {exact}, error {err:e} > bound {bound:e} ({d:?})"
                );
                worst = worst.max(err / bound);
            }
        }
    }
    worst
}

fn device() -> Device {
    Device::cpu(256 << 20, AllocatorConfig::default())
}

/// Runs `kernel` on one case with both kinds of data and checks it; returns the output of the
/// `Floats` run.
fn run(kernel: Bf16Gemm, d: Dims, fa: Form, fb: Form) -> Vec<bf16> {
    run_on(kernel, d, fa, fb, Data::Integers);
    run_on(kernel, d, fa, fb, Data::Floats)
}

fn run_on(kernel: Bf16Gemm, d: Dims, fa: Form, fb: Form, data: Data) -> Vec<bf16> {
    let (a, la) = operand(d.batch, d.m, d.k, fa, 1, data);
    let (b, lb) = operand(d.batch, d.k, d.n, fb, 2, data);
    let out = multiply(kernel, (&a, &la), (&b, &lb), d);
    let worst = check((&a, &la), (&b, &lb), &out, d, data);
    if data == Data::Floats {
        eprintln!("{kernel:?} {d:?} {fa:?}×{fb:?}: worst error {worst:.2e} of the bound");
    }
    out
}

/// `a @ b` on `kernel`, checking that its scratch went back to the device.
fn multiply(
    kernel: Bf16Gemm,
    (a, la): (&[bf16], &Layout),
    (b, lb): (&[bf16], &Layout),
    d: Dims,
) -> Vec<bf16> {
    let mut out = vec![bf16::from_f32(f32::NAN); d.batch * d.m * d.n];
    let device = device();
    match kernel {
        Bf16Gemm::Amx => amx::matmul(&device, a, la, b, lb, &mut out, d).unwrap(),
        Bf16Gemm::Native => native(&device, (a, la), (b, lb), &mut out, d).unwrap(),
        Bf16Gemm::Fma => fma_bf16(&device, (a, la), (b, lb), &mut out, d).unwrap(),
        Bf16Gemm::Widening => matmul_widening(&device, a, la, b, lb, &mut out, d).unwrap(),
    }
    assert_eq!(
        device.stats().allocated_bytes.all.current,
        0,
        "scratch freed"
    );
    out
}

/// The same (batch, rows, cols) matrices as `data` (row-major), stored transposed.
fn transposed_copy(data: &[bf16], batch: usize, rows: usize, cols: usize) -> (Vec<bf16>, Layout) {
    let mut t = data.to_vec();
    for i in 0..batch {
        for r in 0..rows {
            for c in 0..cols {
                t[i * rows * cols + c * rows + r] = data[i * rows * cols + r * cols + c];
            }
        }
    }
    let layout = Layout::new(vec![batch, rows, cols], vec![rows * cols, 1, rows], 0);
    (t, layout)
}

/// Every kernel this CPU runs: AMX and native where it has them, and the fallback.
fn kernels() -> Vec<Bf16Gemm> {
    let mut out = Vec::new();
    if amx_supported() {
        out.push(Bf16Gemm::Amx);
    }
    if native_supported() {
        out.push(Bf16Gemm::Native);
    }
    if fma_supported() {
        out.push(Bf16Gemm::Fma);
    }
    out.push(Bf16Gemm::Widening);
    out
}

fn dims(batch: usize, m: usize, n: usize, k: usize) -> Dims {
    Dims { batch, m, n, k }
}

#[test]
fn one_by_one_by_one() {
    for kernel in kernels() {
        let out = run(kernel, dims(1, 1, 1, 1), Form::RowMajor, Form::RowMajor);
        // Exactly one product, exact in f32, then rounded once: bf16(a·b).
        let (a, b) = (values(1, 1, Data::Floats)[0], values(1, 2, Data::Floats)[0]);
        assert_eq!(out[0], bf16::from_f32(a.to_f32() * b.to_f32()));
    }
}

#[test]
fn odd_k_and_ragged_edges() {
    // m and n off the 6 × 64 tile, k odd (a half-empty last pair) and tiny.
    for (m, n, k) in [
        (1, 1, 3),
        (7, 65, 5),
        (13, 130, 17),
        (6, 64, 2),
        (5, 63, 1),
        (1, 200, 9),
    ] {
        for kernel in kernels() {
            run(kernel, dims(1, m, n, k), Form::RowMajor, Form::RowMajor);
        }
    }
}

#[test]
fn deep_k_carries_sums_across_k_blocks() {
    // k beyond one k block (256): partial sums go through the task's f32 tile.
    // Even k too (514: a row-major A read in place, three k blocks, m ragged).
    for (m, n, k) in [(20, 70, 257), (9, 64, 513), (31, 100, 1001), (13, 70, 514)] {
        for kernel in kernels() {
            run(kernel, dims(1, m, n, k), Form::RowMajor, Form::RowMajor);
        }
    }
}

#[test]
fn transposed_and_strided_operands() {
    let forms = [
        Form::RowMajor,
        Form::Transposed,
        Form::EveryOther,
        Form::Narrowed,
    ];
    for fa in forms {
        for fb in forms {
            for kernel in kernels() {
                // k odd (packed A) and even (a unit-stride A read in place by the native kernel).
                run(kernel, dims(2, 19, 67, 41), fa, fb);
                run(kernel, dims(2, 19, 67, 40), fa, fb);
            }
        }
    }
}

#[test]
fn batches_small_and_large() {
    for kernel in kernels() {
        // Small products: 11 batch elements, packed 8 at a time, computed in parallel.
        run(
            kernel,
            dims(11, 16, 24, 15),
            Form::RowMajor,
            Form::Transposed,
        );
        // Products above the threshold: one after another, each split across threads.
        run(
            kernel,
            dims(3, 100, 130, 97),
            Form::Transposed,
            Form::RowMajor,
        );
        // A weight shared by every batch element.
        run(kernel, dims(4, 50, 70, 33), Form::RowMajor, Form::Broadcast);
        run(kernel, dims(9, 12, 8, 7), Form::Broadcast, Form::EveryOther);
    }
}

#[test]
fn gpt_layer_shapes() {
    // A linear layer of width 384 (forward, and its two backward products) on 96 tokens.
    for kernel in kernels() {
        run(
            kernel,
            dims(1, 96, 1152, 384),
            Form::RowMajor,
            Form::RowMajor,
        );
        run(
            kernel,
            dims(1, 96, 384, 1152),
            Form::RowMajor,
            Form::Transposed,
        );
        run(
            kernel,
            dims(1, 384, 1152, 96),
            Form::Transposed,
            Form::RowMajor,
        );
    }
}

#[test]
fn packed_and_amx_bits_do_not_depend_on_the_thread_count() {
    let d = dims(2, 200, 300, 600);
    for kernel in kernels() {
        if kernel == Bf16Gemm::Widening {
            continue;
        }
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| run(kernel, d, Form::RowMajor, Form::Transposed))
        };
        let one = on(1);
        for threads in [2, 3, 5] {
            let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&on(threads)),
                bits(&one),
                "{kernel:?}, {threads} threads"
            );
        }
    }
}

#[test]
fn packed_and_amx_bits_do_not_depend_on_operand_layout() {
    // The same matrices row-major and stored transposed: the AMX kernel reads whole 32-row
    // blocks of a row-major A in place and packs a transposed one, the native kernel reads a
    // row-major A of even k in place; k = 1088 spans three slabs
    // of 512 (the last partial) and k = 600 two, whose sums wait in f32 between slabs; m = 70
    // leaves a ragged block that is packed either way.
    for d in [dims(1, 70, 50, 1088), dims(2, 64, 96, 600)] {
        let (a, la) = operand(d.batch, d.m, d.k, Form::RowMajor, 1, Data::Floats);
        let (b, lb) = operand(d.batch, d.k, d.n, Form::RowMajor, 2, Data::Floats);
        let (at, lat) = transposed_copy(&a, d.batch, d.m, d.k);
        let (bt, lbt) = transposed_copy(&b, d.batch, d.k, d.n);
        for kernel in kernels() {
            if kernel == Bf16Gemm::Widening {
                continue;
            }
            let plain = multiply(kernel, (&a, &la), (&b, &lb), d);
            check((&a, &la), (&b, &lb), &plain, d, Data::Floats);
            let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (x, y) in [
                ((&at, &lat), (&b, &lb)),
                ((&a, &la), (&bt, &lbt)),
                ((&at, &lat), (&bt, &lbt)),
            ] {
                let other = multiply(kernel, (x.0, x.1), (y.0, y.1), d);
                assert_eq!(bits(&other), bits(&plain), "{kernel:?} {d:?}");
            }
        }
    }
}

#[test]
fn amx_tile_edges_and_padding() {
    // m, n and k on, just under and just over the 32 × 32 block and the 32-deep tile step.
    for (m, n, k) in [
        (32, 32, 32),
        (31, 33, 31),
        (33, 31, 33),
        (1, 1, 64),
        (64, 17, 65),
    ] {
        for kernel in kernels() {
            run(kernel, dims(1, m, n, k), Form::RowMajor, Form::RowMajor);
            run(kernel, dims(1, m, n, k), Form::Transposed, Form::Transposed);
        }
    }
}

#[test]
fn selection_names_a_kernel_this_cpu_runs() {
    let kernel = bf16_gemm();
    assert!(
        kernel == Bf16Gemm::Widening
            || (kernel == Bf16Gemm::Native && native_supported())
            || (kernel == Bf16Gemm::Fma && fma_supported())
            || (kernel == Bf16Gemm::Amx && amx_supported())
    );
}
