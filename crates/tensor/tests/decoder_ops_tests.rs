//! The ops the Llama family's decoder adds: the rotary embedding (hand-derived rotations, the
//! Hugging Face `rotate_half` formula, the inverse rotation as its gradient), the fused SwiGLU
//! product (hand values, the composition's bits, one fewer saved tensor) and
//! `repeat_interleave` for grouped-query heads (hand layout, summed gradient), each against
//! central finite differences. RMS norm and SiLU have theirs in `forward_tests` and
//! `grad_tests`.

use crate::common;

use common::{
    Input, assert_close, check_grads_on, device, input, output_and_grad_bits, tensor, values,
};
use headroom_memory::{Category, Device};
use headroom_tensor::{DType, Gradients, Tape, Tensor};

const H: f32 = 1e-2;
const ATOL: f64 = 2e-3;
const RTOL: f64 = 1e-2;

/// Llama's tables: position p, pair i of D/2 at angle p·base^(−2i/D), as f32 `(T, D/2)`.
fn tables(device: &Device, t: usize, d: usize, base: f64) -> (Tensor, Tensor, Vec<f64>) {
    let half = d / 2;
    let angles: Vec<f64> = (0..t * half)
        .map(|k| (k / half) as f64 * base.powf(-2.0 * (k % half) as f64 / d as f64))
        .collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
    (
        tensor(device, &[t, half], &cos),
        tensor(device, &[t, half], &sin),
        angles,
    )
}

#[test]
fn rotary_rotates_each_pair_by_its_positions_angle() {
    let d = device();
    // T = 2, H = 1, D = 4. Position 0 has angle 0 (identity); at position 1 the pairs (0, 2)
    // and (1, 3) turn by π/2 and π/3.
    let (a, b) = (std::f64::consts::FRAC_PI_2, std::f64::consts::FRAC_PI_3);
    let cos = tensor(&d, &[2, 2], &[1.0, 1.0, a.cos() as f32, b.cos() as f32]);
    let sin = tensor(&d, &[2, 2], &[0.0, 0.0, a.sin() as f32, b.sin() as f32]);
    let x = tensor(&d, &[1, 2, 1, 4], &[1., 2., 3., 4., 1., 2., 3., 4.]);
    let y = x.rotary(&cos, &sin).unwrap().to_vec_f32().unwrap();
    let r3 = 3f64.sqrt();
    // (x₀, x₂) = (1, 3) by π/2 → (−3, 1); (x₁, x₃) = (2, 4) by π/3 → (1 − 2√3, 2 + √3).
    let want = [1., 2., 3., 4., -3., 1. - 2. * r3, 1., 2. + r3];
    assert_close(&y, &want, 1e-6, 1e-6, "rotary");
}

#[test]
fn rotary_is_hugging_faces_rotate_half_formula() {
    // q·cos + rotate_half(q)·sin with cos and sin of width D (each angle twice) and
    // rotate_half(q) = (−q[D/2..], q[..D/2]), in f64 over (B, T, H, D) = (2, 5, 3, 8).
    let d = device();
    let (b, t, h, dd) = (2, 5, 3, 8);
    let half = dd / 2;
    let (cos, sin, angles) = tables(&d, t, dd, 10_000.0);
    let xv = values(b * t * h * dd, 7, -2.0, 2.0);
    let y = tensor(&d, &[b, t, h, dd], &xv)
        .rotary(&cos, &sin)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    let mut want = vec![0.0f64; xv.len()];
    for (r, row) in xv.chunks(dd).enumerate() {
        let p = (r / h) % t;
        for j in 0..dd {
            let theta = angles[p * half + j % half];
            let rotated = if j < half {
                -(row[j + half] as f64)
            } else {
                row[j - half] as f64
            };
            want[r * dd + j] = row[j] as f64 * theta.cos() + rotated * theta.sin();
        }
    }
    assert_close(&y, &want, 1e-5, 1e-5, "rotate_half");
}

#[test]
fn rotary_gradients_match_finite_differences_and_are_the_inverse_rotation() {
    let d = device();
    let (cos, sin, _) = tables(&d, 3, 6, 100.0);
    let ins = [input(&[2, 3, 2, 6], 8, -1.5, 1.5)];
    check_grads_on(&d, &ins, |x| x[0].rotary(&cos, &sin), H, ATOL, RTOL);
    // On a permuted (non-contiguous) input too: (B, H, T, D) viewed as (B, T, H, D).
    let ins = [input(&[2, 2, 3, 6], 9, -1.5, 1.5)];
    check_grads_on(
        &d,
        &ins,
        |x| x[0].permute(&[0, 2, 1, 3])?.rotary(&cos, &sin),
        H,
        ATOL,
        RTOL,
    );
    // The gradient of Σ r ⊙ rot(x) is rot⁻¹(r): rotating it forward gives r back.
    let x = tensor(&d, &[1, 3, 1, 6], &values(18, 10, -1.0, 1.0)).track();
    let r = tensor(&d, &[1, 3, 1, 6], &values(18, 11, -1.0, 1.0));
    let tape = Tape::new();
    let loss = tape
        .record(|| x.rotary(&cos, &sin)?.mul(&r)?.sum_all())
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let back = grads.get(&x).unwrap().rotary(&cos, &sin).unwrap();
    let want: Vec<f64> = r.to_vec_f32().unwrap().iter().map(|&v| v as f64).collect();
    assert_close(
        &back.to_vec_f32().unwrap(),
        &want,
        1e-6,
        1e-6,
        "rot(rot⁻¹ r)",
    );
}

#[test]
fn rotary_in_bf16_is_the_f32_rotation_rounded_once_and_saves_nothing() {
    let d = device();
    let (cos, sin, _) = tables(&d, 4, 8, 10_000.0);
    let x = tensor(&d, &[2, 4, 2, 8], &values(128, 12, -3.0, 3.0)).cast(DType::BF16);
    let x = x.unwrap();
    let low = x.rotary(&cos, &sin).unwrap();
    assert_eq!(low.dtype(), DType::BF16);
    let wide = x
        .cast(DType::F32)
        .unwrap()
        .rotary(&cos, &sin)
        .unwrap()
        .cast(DType::BF16)
        .unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        let v = t.cast(DType::F32).unwrap().to_vec_f32().unwrap();
        v.iter().map(|v| v.to_bits()).collect()
    };
    assert_eq!(bits(&low), bits(&wide));
    // Under a tape it keeps only its output: the tables are inputs, x is an input.
    let xt = tensor(&d, &[2, 4, 2, 8], &values(128, 13, -1.0, 1.0)).track();
    let before = d.stats().category_bytes[Category::Activation.index()].current;
    let tape = Tape::new();
    let y = tape.record(|| xt.rotary(&cos, &sin)).unwrap();
    let kept = d.stats().category_bytes[Category::Activation.index()].current - before;
    assert_eq!(kept, 512, "one (2, 4, 2, 8) f32 output, 512 bytes");
    drop(y);
}

#[test]
fn rotary_refuses_an_odd_head_dimension_and_tables_of_the_wrong_shape() {
    let d = device();
    let (cos, sin, _) = tables(&d, 2, 4, 10.0);
    let odd = tensor(&d, &[1, 2, 1, 3], &[0.0; 6]);
    let e = odd.rotary(&cos, &sin).unwrap_err().to_string();
    assert!(e.contains("even"), "{e}");
    let long = tensor(&d, &[1, 3, 1, 4], &[0.0; 12]);
    let e = long.rotary(&cos, &sin).unwrap_err().to_string();
    assert!(e.contains("(T, D/2) = (3, 2)"), "{e}");
}

#[test]
fn swiglu_is_silu_of_the_gate_times_up() {
    let d = device();
    let g = tensor(&d, &[3], &[0.0, 1.0, -2.0]);
    let u = tensor(&d, &[3], &[3.0, 4.0, 5.0]);
    // silu(z) = z/(1 + e^−z): silu(0) = 0, silu(1) = 1/(1 + e^−1), silu(−2) = −2/(1 + e²).
    let e = std::f64::consts::E;
    let want = [0.0, 4.0 / (1.0 + 1.0 / e), 5.0 * -2.0 / (1.0 + e * e)];
    let y = g.swiglu(&u).unwrap().to_vec_f32().unwrap();
    assert_close(&y, &want, 1e-6, 1e-6, "swiglu");
}

#[test]
fn swiglu_gradients_match_finite_differences_and_the_composition_bit_for_bit() {
    let d = device();
    let ins = [input(&[3, 7], 14, -3.0, 3.0), input(&[3, 7], 15, -2.0, 2.0)];
    check_grads_on(&d, &ins, |t| t[0].swiglu(&t[1]), H, ATOL, RTOL);
    let inputs: Vec<Tensor> = [(16, -4.0, 4.0), (17, -2.0, 2.0)]
        .iter()
        .map(|&(seed, lo, hi)| tensor(&d, &[2, 5, 9], &values(90, seed, lo, hi)))
        .collect();
    for dtype in [DType::F32, DType::BF16] {
        let fused = output_and_grad_bits(&d, dtype, &inputs, 18, |t| t[0].swiglu(&t[1]));
        let plain = output_and_grad_bits(&d, dtype, &inputs, 18, |t| t[0].silu()?.mul(&t[1]));
        assert_eq!(fused, plain, "{dtype:?}");
    }
}

#[test]
fn swiglu_keeps_its_inputs_only() {
    // The gate and up (8 × 64 f32, 2048 bytes each) are inputs here. The composition keeps
    // SiLU's output (2048 bytes, saved by the product) and the output (2048); fused, the output.
    for fused in [false, true] {
        let d = device();
        let g = tensor(&d, &[8, 64], &values(512, 19, -2.0, 2.0)).track();
        let u = tensor(&d, &[8, 64], &values(512, 20, -2.0, 2.0)).track();
        let tape = Tape::new();
        let y = tape
            .record(|| match fused {
                true => g.swiglu(&u),
                false => g.silu()?.mul(&u),
            })
            .unwrap();
        let kept = d.stats().category_bytes[Category::Activation.index()].current;
        assert_eq!(kept, if fused { 2048 } else { 4096 }, "fused: {fused}");
        let loss = tape.record(|| y.sum_all()).unwrap();
        let mut grads = Gradients::new();
        tape.backward(&loss, &mut grads).unwrap();
        assert!(grads.get(&g).is_some() && grads.get(&u).is_some());
    }
}

#[test]
fn swiglu_forward_allocates_its_output_only() {
    // gate and up 8 × 64 f32 (2048 bytes each, a multiple of the 512-byte block): the one-pass
    // product raises the peak by the output's 2048 bytes; SiLU then mul would first allocate
    // the SiLU's 2048 as well (peak + 4096).
    let d = device();
    let g = tensor(&d, &[8, 64], &values(512, 21, -2.0, 2.0));
    let u = tensor(&d, &[8, 64], &values(512, 22, -2.0, 2.0));
    let before = d.stats().allocated_bytes.all.current;
    d.reset_peak_stats();
    let y = g.swiglu(&u).unwrap();
    assert_eq!(d.stats().allocated_bytes.all.peak - before, 2048);
    drop(y);
}

#[test]
fn repeat_interleave_shares_each_head_with_its_group() {
    let d = device();
    // (1, 2 heads, 2) → 3 copies each: heads 0, 0, 0, 1, 1, 1 (Hugging Face's repeat_kv).
    let x = tensor(&d, &[1, 2, 2], &[1., 2., 3., 4.]);
    let y = x.repeat_interleave(1, 3).unwrap();
    assert_eq!(y.shape(), [1, 6, 2]);
    assert_eq!(
        y.to_vec_f32().unwrap(),
        [1., 2., 1., 2., 1., 2., 3., 4., 3., 4., 3., 4.]
    );
    // The gradient sums the copies: each head's is 3 × the ones it was given.
    let ins = [Input {
        shape: vec![2, 3, 2, 4],
        data: values(48, 21, -1.0, 1.0),
    }];
    check_grads_on(&d, &ins, |t| t[0].repeat_interleave(2, 4), H, ATOL, RTOL);
    let xt = tensor(&d, &[1, 2, 2], &[1., 2., 3., 4.]).track();
    let tape = Tape::new();
    let loss = tape
        .record(|| xt.repeat_interleave(1, 3)?.sum_all())
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    assert_eq!(grads.get(&xt).unwrap().to_vec_f32().unwrap(), [3.0; 4]);
    assert!(x.repeat_interleave(1, 0).is_err());
}

#[test]
fn a_shape_only_dry_run_allocates_what_the_real_run_does() {
    // Rotary queries and keys, grouped key heads and the SwiGLU product, forward and backward:
    // the allocator's peak and held activations are the same with and without bytes.
    let run_on = |device: &Device| -> (i64, i64) {
        let zeros = |shape: &[usize], category| {
            Tensor::zeros(device, shape, DType::F32, category, None).unwrap()
        };
        let (cos, sin) = (
            zeros(&[16, 4], Category::Input),
            zeros(&[16, 4], Category::Input),
        );
        let q = zeros(&[2, 16, 4, 8], Category::Input).track();
        let k = zeros(&[2, 16, 2, 8], Category::Input).track();
        let (g, u) = (
            zeros(&[2, 16, 32], Category::Input).track(),
            zeros(&[2, 16, 32], Category::Input).track(),
        );
        device.reset_peak_stats();
        let tape = Tape::new();
        let loss = tape
            .record(|| {
                let q = q.rotary(&cos, &sin)?;
                let k = k.rotary(&cos, &sin)?.repeat_interleave(2, 2)?;
                let s = q.mul(&k)?.sum_all()?;
                s.add(&g.swiglu(&u)?.sum_all()?)
            })
            .unwrap();
        let held = device.stats().category_bytes[Category::Activation.index()].current;
        let mut grads = Gradients::new();
        tape.backward(&loss, &mut grads).unwrap();
        (held, device.stats().allocated_bytes.all.peak)
    };
    let real = run_on(&device());
    let dry = run_on(&Device::shape_only(
        64 << 20,
        headroom_memory::AllocatorConfig::default(),
    ));
    assert_eq!(real, dry);
    assert!(real.0 > 0);
}
