//! The autocast policy: matmuls in the low dtype, normalisations, softmax and cross-entropy in
//! f32, mixed binary ops promoted; the saved casts are counted as activations; gradients of f32
//! parameters stay f32 and close to an f32 run.

use crate::common;

use common::{device, ids, tensor, values};
use headroom_memory::Category;
use headroom_tensor::{DType, Gradients, Tape, autocast, checkpoint};

#[test]
fn ops_follow_the_cast_policies() {
    let device = device();
    let x = tensor(&device, &[4, 8], &values(32, 1, -1.0, 1.0));
    let w = tensor(&device, &[8, 8], &values(64, 2, -1.0, 1.0));
    let (g, b) = (
        tensor(&device, &[8], &[1.0; 8]),
        tensor(&device, &[8], &[0.0; 8]),
    );
    autocast(DType::BF16, || {
        let h = x.matmul(&w).unwrap();
        assert_eq!(h.dtype(), DType::BF16); // lower precision
        assert_eq!(h.layer_norm(&g, &b, 1e-5).unwrap().dtype(), DType::F32); // fp32
        assert_eq!(h.softmax().unwrap().dtype(), DType::F32); // fp32
        assert_eq!(h.add(&x).unwrap().dtype(), DType::F32); // promote
        assert_eq!(h.gelu().unwrap().dtype(), DType::BF16); // unlisted: input dtype
    });
    // Outside the scope nothing is cast, and mixed dtypes are an error.
    assert_eq!(x.matmul(&w).unwrap().dtype(), DType::F32);
    assert!(x.add(&x.cast(DType::BF16).unwrap()).is_err());
}

#[test]
fn linear_lowers_its_bias_with_its_operands() {
    let device = device();
    let (xs, ws, bs) = (
        values(4 * 8, 5, -1.0, 1.0),
        values(8 * 6, 6, -1.0, 1.0),
        values(6, 7, -1.0, 1.0),
    );
    let x = tensor(&device, &[4, 8], &xs);
    let w = tensor(&device, &[8, 6], &ws);
    let b = tensor(&device, &[6], &bs).track();
    let tape = Tape::new();
    let (y, loss) = autocast(DType::BF16, || {
        let y = tape.record(|| x.linear(&w, &b)).unwrap();
        let loss = tape.record(|| y.cast(DType::F32)?.sum_all()).unwrap();
        (y, loss)
    });
    // PyTorch's autocast runs `linear` in the low dtype, bias included: the output stays bf16
    // instead of being promoted to f32 by an f32 bias.
    assert_eq!(y.dtype(), DType::BF16);
    // Reference: the bf16-rounded operands in f64, the product rounded to bf16, plus the
    // bf16-rounded bias, rounded to bf16 again (the two roundings of matmul then add).
    let r = |v: f32| half::bf16::from_f32(v).to_f32();
    let got = y.to_vec_f32().unwrap();
    for i in 0..4 {
        for j in 0..6 {
            let dot: f64 = (0..8)
                .map(|k| r(xs[i * 8 + k]) as f64 * r(ws[k * 6 + j]) as f64)
                .sum();
            let want = r(r(dot as f32) + r(bs[j]));
            // The GEMM sums in f32 in its own order: allow one bf16 step of the result.
            assert!(
                (got[i * 6 + j] - want).abs() <= want.abs() / 128.0 + 1e-6,
                "({i}, {j}): {} against {want}",
                got[i * 6 + j]
            );
        }
    }
    // The bias's gradient comes back to the f32 parameter through the cast: each of the four
    // rows adds 1 to every bias element, exact in bf16.
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let db = grads.get(&b).unwrap();
    assert_eq!(db.dtype(), DType::F32);
    assert_eq!(db.to_vec_f32().unwrap(), vec![4.0; 6]);
}

#[test]
fn autocast_activation_bytes_and_f32_gradients() {
    let device = device();
    let (n, c, d) = (8, 100, 70);
    let x = tensor(&device, &[n, c], &values(n * c, 3, -1.0, 1.0)); // input, not tracked
    let w = tensor(&device, &[c, d], &values(c * d, 4, -0.1, 0.1)).track();
    let y = ids(&device, &[n], &[0, 5, 9, 13, 21, 34, 55, 69]);
    let tape = Tape::new();
    let loss = tape
        .record(|| autocast(DType::BF16, || x.matmul(&w)?.cross_entropy(&y)))
        .unwrap();
    assert_eq!(loss.dtype(), DType::F32);
    // Saved: the bf16 copy of x (matmul needs it for dW)      8·100·2 = 1600 → 2048
    //        (W's bf16 copy is not saved: x needs no gradient, so it is freed)
    //        log-softmax output in f32 (the logits were cast up) 8·70·4 = 2240 → 2560
    //        the loss                                                    4 →  512
    let activation = device.stats().category_bytes[Category::Activation.index()].current;
    assert_eq!(activation, 2048 + 2560 + 512);
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let dw = grads.get(&w).unwrap();
    assert_eq!(dw.dtype(), DType::F32);
    // Against the f32 run: bf16 rounding of x and W (2⁻⁸ relative each) bounds the error.
    let tape32 = Tape::new();
    let loss32 = tape32.record(|| x.matmul(&w)?.cross_entropy(&y)).unwrap();
    let mut grads32 = Gradients::new();
    tape32.backward(&loss32, &mut grads32).unwrap();
    let (a, r) = (
        dw.to_vec_f32().unwrap(),
        grads32.get(&w).unwrap().to_vec_f32().unwrap(),
    );
    let scale = r.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = a
        .iter()
        .zip(&r)
        .fold(0f32, |m, (p, q)| m.max((p - q).abs()))
        / scale;
    assert!(err < 0.02, "{err}");
    assert!((loss.to_scalar_f32().unwrap() - loss32.to_scalar_f32().unwrap()).abs() < 0.01);
}

#[test]
fn checkpoint_recomputes_under_the_recorded_autocast_state() {
    let device = device();
    let x = tensor(&device, &[6, 16], &values(96, 5, -1.0, 1.0)).track();
    let w = tensor(&device, &[16, 16], &values(256, 6, -0.3, 0.3)).track();
    let run = |ckpt: bool| {
        let tape = Tape::new();
        let w2 = w.clone();
        let f = move |xs: &[headroom_tensor::Tensor]| xs[0].matmul(&w2)?.gelu()?.softmax();
        let loss = tape
            .record(|| {
                autocast(DType::BF16, || {
                    if ckpt {
                        checkpoint(&[&x], f)
                    } else {
                        f(std::slice::from_ref(&x))
                    }
                })?
                .mean_all()
            })
            .unwrap();
        // Backward outside the autocast scope: the recompute must still run in bf16.
        let mut grads = Gradients::new();
        tape.backward(&loss, &mut grads).unwrap();
        (
            grads.get(&x).unwrap().to_vec_f32().unwrap(),
            grads.get(&w).unwrap().to_vec_f32().unwrap(),
        )
    };
    assert_eq!(run(false), run(true));
}
