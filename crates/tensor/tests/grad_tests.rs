//! Backward of every op against central finite differences (see `common::check_grads`),
//! including broadcasting and non-contiguous (transposed, sliced) inputs.

use crate::common;

use common::{Input, check_grads, device, ids, input, tensor};
use headroom_tensor::{Gradients, Tape, Tensor, checkpoint, rng};

const H: f32 = 1e-2;
const ATOL: f64 = 2e-3;
const RTOL: f64 = 1e-2;

fn check(inputs: &[Input], f: impl Fn(&[Tensor]) -> headroom_tensor::Result<Tensor>) {
    check_grads(inputs, f, H, ATOL, RTOL);
}

#[test]
fn polynomial_gradient_matches_hand_derivation() {
    // y = x² + 5x + 4, so dy/dx = 2x + 5: at x = [-1, 0, 2] that is [3, 5, 9].
    let device = device();
    let x = tensor(&device, &[3], &[-1.0, 0.0, 2.0]).track();
    let tape = Tape::new();
    let y = tape
        .record(|| x.mul(&x)?.add(&x.scale(5.0)?)?.add_scalar(4.0)?.sum_all())
        .unwrap();
    // Σ y = (1 − 5 + 4) + 4 + (4 + 10 + 4) = 0 + 4 + 18 = 22.
    assert_eq!(y.to_scalar_f32().unwrap(), 22.0);
    let mut grads = Gradients::new();
    tape.backward(&y, &mut grads).unwrap();
    assert_eq!(
        grads.get(&x).unwrap().to_vec_f32().unwrap(),
        vec![3.0, 5.0, 9.0]
    );
}

#[test]
fn add_sub_mul_div_broadcast() {
    // (2, 3, 4) against (3, 1) and (4,): both broadcast along different axes.
    let ins = [
        input(&[2, 3, 4], 1, -1.0, 1.0),
        input(&[3, 1], 2, -1.0, 1.0),
        input(&[4], 3, 0.5, 1.5),
    ];
    check(&ins, |t| {
        t[0].add(&t[1])?.sub(&t[2])?.mul(&t[1])?.div(&t[2])
    });
}

#[test]
fn binary_ops_on_transposed_inputs() {
    let ins = [input(&[4, 3], 4, -1.0, 1.0), input(&[3, 4], 5, 0.5, 2.0)];
    check(&ins, |t| {
        t[0].transpose(0, 1)?
            .mul(&t[1])?
            .div(&t[0].transpose(1, 0)?.add_scalar(3.0)?)
    });
}

#[test]
fn unary_activations() {
    let ins = [input(&[3, 5], 6, -2.0, 2.0)];
    check(&ins, |t| t[0].gelu());
    check(&ins, |t| t[0].silu());
    check(&ins, |t| t[0].tanh());
    check(&ins, |t| t[0].sigmoid());
    check(&ins, |t| t[0].exp());
    check(&ins, |t| t[0].neg()?.affine(3.0, 1.0));
    // ReLU's kink at 0 is avoided: inputs are bounded away from zero.
    let away = [Input {
        shape: vec![6],
        data: vec![-1.5, -0.5, -0.2, 0.3, 0.9, 2.0],
    }];
    check(&away, |t| t[0].relu());
    let positive = [input(&[3, 5], 7, 0.5, 2.0)];
    check(&positive, |t| t[0].log());
    check(&positive, |t| t[0].sqrt());
    check(&positive, |t| t[0].powf(2.5));
}

#[test]
fn reductions_over_axes() {
    let ins = [input(&[2, 3, 4], 8, -1.0, 1.0)];
    check(&ins, |t| t[0].sum(&[1]));
    check(&ins, |t| t[0].sum_keepdim(&[0, 2]));
    check(&ins, |t| t[0].mean(&[-1]));
    check(&ins, |t| t[0].mean_all());
    check(&ins, |t| t[0].transpose(0, 2)?.sum(&[0]));
    // Values 0.1 apart (a permutation of −1.2, −1.1, …, 1.1), so a ±h step never changes
    // which element is the maximum.
    let spread = [Input {
        shape: vec![2, 3, 4],
        data: (0..24).map(|i| ((i * 7) % 24) as f32 * 0.1 - 1.2).collect(),
    }];
    check(&spread, |t| t[0].max(&[2]));
    check(&spread, |t| t[0].max_keepdim(&[0, 1]));
}

#[test]
fn views_reshape_permute_narrow_cat() {
    let ins = [
        input(&[2, 3, 4], 9, -1.0, 1.0),
        input(&[2, 2, 4], 10, -1.0, 1.0),
    ];
    check(&ins, |t| t[0].permute(&[2, 0, 1])?.reshape(&[4, 6])?.exp());
    check(&ins, |t| t[0].narrow(1, 1, 2)?.mul(&t[1]));
    check(&ins, |t| Tensor::cat(&[&t[0], &t[1]], 1)?.tanh());
    check(&ins, |t| {
        Tensor::cat(&[&t[0].transpose(0, 2)?, &t[1].transpose(0, 2)?], 1)?
            .contiguous()?
            .sigmoid()
    });
    check(&ins, |t| {
        t[1].narrow(2, 1, 1)?
            .broadcast_as(&[3, 2, 2, 4])?
            .mul(&t[1])
    });
}

#[test]
fn matmul_plain_batched_broadcast_and_transposed() {
    let a = input(&[3, 4], 11, -1.0, 1.0);
    let b = input(&[4, 5], 12, -1.0, 1.0);
    check(&[a, b], |t| t[0].matmul(&t[1]));
    // (2, 3, 4) @ (4, 5): the folded linear-layer path.
    check(
        &[
            input(&[2, 3, 4], 13, -1.0, 1.0),
            input(&[4, 5], 14, -1.0, 1.0),
        ],
        |t| t[0].matmul(&t[1]),
    );
    // Batched with a broadcast batch dim: (2, 3, 4) @ (1, 4, 5).
    check(
        &[
            input(&[2, 3, 4], 15, -1.0, 1.0),
            input(&[1, 4, 5], 16, -1.0, 1.0),
        ],
        |t| t[0].matmul(&t[1]),
    );
    // Transposed operands: Aᵀ @ Bᵀ with A (4, 3), B (5, 4).
    check(
        &[input(&[4, 3], 17, -1.0, 1.0), input(&[5, 4], 18, -1.0, 1.0)],
        |t| t[0].transpose(0, 1)?.matmul(&t[1].transpose(0, 1)?),
    );
}

#[test]
fn softmax_log_softmax_and_causal_mask() {
    let ins = [input(&[2, 3, 5], 19, -2.0, 2.0)];
    check(&ins, |t| t[0].softmax());
    check(&ins, |t| t[0].log_softmax());
    check(&ins, |t| t[0].transpose(1, 2)?.softmax());
    let scores = [input(&[2, 4, 4], 20, -2.0, 2.0)];
    check(&scores, |t| t[0].causal_mask()?.softmax());
}

#[test]
fn layer_norm_and_rms_norm() {
    let ins = [
        input(&[2, 3, 6], 21, -2.0, 2.0),
        input(&[6], 22, 0.5, 1.5),
        input(&[6], 23, -0.5, 0.5),
    ];
    check(&ins, |t| t[0].layer_norm(&t[1], &t[2], 1e-5));
    check(&ins, |t| t[0].rms_norm(&t[1], 1e-5));
    // Non-contiguous input: normalise the rows of a transpose.
    let tr = [
        input(&[6, 4], 24, -2.0, 2.0),
        input(&[6], 25, 0.5, 1.5),
        input(&[6], 26, -0.5, 0.5),
    ];
    check(&tr, |t| {
        t[0].transpose(0, 1)?.layer_norm(&t[1], &t[2], 1e-5)
    });
}

#[test]
fn embedding_scatter_adds_repeated_ids() {
    let device = device();
    // Ids repeat (2 appears three times): its gradient row sums three output rows.
    let token_ids = ids(&device, &[2, 3], &[2, 0, 2, 4, 2, 1]);
    check(&[input(&[5, 3], 27, -1.0, 1.0)], |t| {
        t[0].embedding(&token_ids)
    });
}

#[test]
fn cross_entropy_with_integer_targets() {
    let device = device();
    let targets = ids(&device, &[2, 3], &[0, 4, 2, 1, 1, 3]);
    check(&[input(&[2, 3, 5], 28, -2.0, 2.0)], |t| {
        t[0].cross_entropy(&targets)
    });
}

#[test]
fn cross_entropy_value_matches_hand_computation() {
    // logits [0, ln 3] with target 1: p = 3/(1+3) = 0.75, loss = −ln 0.75.
    let device = device();
    let logits = tensor(&device, &[1, 2], &[0.0, 3f32.ln()]).track();
    let tape = Tape::new();
    let loss = tape
        .record(|| logits.cross_entropy(&ids(&device, &[1], &[1])))
        .unwrap();
    assert!((loss.to_scalar_f32().unwrap() - (-(0.75f32).ln())).abs() < 1e-6);
    // dL/dlogits = p − onehot = [0.25, −0.25].
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let g = grads.get(&logits).unwrap().to_vec_f32().unwrap();
    assert!(
        (g[0] - 0.25).abs() < 1e-6 && (g[1] + 0.25).abs() < 1e-6,
        "{g:?}"
    );
}

#[test]
fn dropout_gradient_uses_the_same_mask() {
    rng::manual_seed(1234);
    check(&[input(&[4, 8], 29, -1.0, 1.0)], |t| {
        t[0].dropout(0.3)?.tanh()
    });
}

#[test]
fn checkpoint_scope_gradients() {
    // A scope capturing a tracked tensor (as a block captures its parameters) and taking one.
    let device = device();
    let w = tensor(&device, &[4, 4], &common::values(16, 30, -1.0, 1.0)).track();
    let w_in = w.clone();
    let ins = [input(&[3, 4], 31, -1.0, 1.0)];
    common::check_grads_on(
        &device,
        &ins,
        move |t| {
            let w = w_in.clone();
            checkpoint(&[&t[0]], move |xs| xs[0].matmul(&w)?.gelu()?.dropout(0.2))
        },
        H,
        ATOL,
        RTOL,
    );
    drop(w);
}

#[test]
fn cast_round_trip_passes_the_gradient_back() {
    // y = f32(bf16(x)); on bf16-representable x the map is the identity, so dy/dx = 1.
    let device = device();
    let x = tensor(&device, &[3], &[0.5, -2.0, 1.25]).track();
    let tape = Tape::new();
    let y = tape
        .record(|| {
            x.cast(headroom_tensor::DType::BF16)?
                .cast(headroom_tensor::DType::F32)?
                .sum_all()
        })
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&y, &mut grads).unwrap();
    assert_eq!(
        grads.get(&x).unwrap().to_vec_f32().unwrap(),
        vec![1.0, 1.0, 1.0]
    );
}

#[test]
fn identity_scope_and_leaf_loss_pass_gradients_through() {
    // A checkpoint scope that returns its input unchanged: d out/d x = 1.
    let device = device();
    let x = tensor(&device, &[3], &[1.0, 2.0, 3.0]).track();
    let tape = Tape::new();
    let y = tape
        .record(|| checkpoint(&[&x], |xs| Ok(xs[0].clone()))?.sum_all())
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&y, &mut grads).unwrap();
    assert_eq!(
        grads.get(&x).unwrap().to_vec_f32().unwrap(),
        vec![1.0, 1.0, 1.0]
    );
    // A tracked one-element leaf as its own loss: dL/dL = 1.
    let l = tensor(&device, &[1], &[5.0]).track();
    let mut grads = Gradients::new();
    Tape::new().backward(&l, &mut grads).unwrap();
    assert_eq!(grads.get(&l).unwrap().to_vec_f32().unwrap(), vec![1.0]);
}

#[test]
fn tensors_can_cross_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tensor>();
}
