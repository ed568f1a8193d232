//! Memory accounting: the `activation` bytes held after a forward equal a sum derived by hand
//! from the op rules (what each op saves for backward, `backprop::Op`), backward returns them to
//! zero, a kept loss retains only itself, and gradient bytes equal parameter bytes.
//!
//! Every allocation here is below 1 MiB, so it is served from the small pool as exactly its
//! request rounded up to a multiple of 512 bytes (`block` below).

use crate::common;

use common::{device, ids, tensor, values};
use headroom_memory::{Category, Device};
use headroom_tensor::{DType, Gradients, ParamBlock, Tape, Tensor, checkpoint, no_grad};

/// Bytes the allocator hands out for a request of `bytes` (< 1 MiB): a multiple of 512.
fn block(bytes: usize) -> i64 {
    (bytes.div_ceil(512) * 512) as i64
}

fn held(device: &Device, c: Category) -> i64 {
    device.stats().category_bytes[c.index()].current
}

fn init(p: &ParamBlock, seed: u64) {
    for (i, t) in p.params().iter().enumerate() {
        t.copy_from_f32(&values(t.numel(), seed + i as u64, -0.5, 0.5))
            .unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// A two-layer MLP: loss = CE(relu(x W1 + b1) W2 + b2, y).

const B: usize = 6;
const D_IN: usize = 10;
const HID: usize = 50;
const D_OUT: usize = 30;

fn mlp_params(device: &Device) -> ParamBlock {
    let p = ParamBlock::new(
        device,
        "mlp",
        &[
            ("w1", &[D_IN, HID]),
            ("b1", &[HID]),
            ("w2", &[HID, D_OUT]),
            ("b2", &[D_OUT]),
        ],
        DType::F32,
    )
    .unwrap();
    init(&p, 40);
    p
}

fn mlp_loss(p: &ParamBlock, x: &Tensor, y: &Tensor) -> headroom_tensor::Result<Tensor> {
    let h = x.matmul(p.param("w1")?)?.add(p.param("b1")?)?.relu()?; // (B, HID)
    h.matmul(p.param("w2")?)?
        .add(p.param("b2")?)?
        .cross_entropy(y) // (B, D_OUT) -> ()
}

#[test]
fn mlp_activation_bytes_match_the_op_rules() {
    let device = device();
    let p = mlp_params(&device);
    let x = tensor(&device, &[B, D_IN], &values(B * D_IN, 1, -1.0, 1.0)); // input, not tracked
    let y = ids(&device, &[B], &[0, 3, 7, 29, 12, 3]);
    let tape = Tape::new();
    let loss = tape.record(|| mlp_loss(&p, &x, &y)).unwrap();

    // Saved after forward (x, y are `input`, the weights `parameter`, so neither counts):
    //   x W1                : matmul saves x (for dW1) — an input, 0 activation bytes
    //   + b1                : add saves nothing; x W1 is freed
    //   relu                : saves its output h (B, HID) f32       = 6·50·4 = 1200 → 1536
    //   h W2                : saves h (already counted) and W2
    //   + b2                : saves nothing; h W2 is freed
    //   log_softmax         : saves its output (B, D_OUT) f32     = 6·30·4 =  720 → 1024
    //   gather, mean, neg   : save the targets (input) and nothing else; (B,) temporaries freed
    //   the loss itself     : () f32 held by the caller           = 4       →  512
    let expected = block(B * HID * 4) + block(B * D_OUT * 4) + block(4);
    assert_eq!(expected, 1536 + 1024 + 512);
    assert_eq!(held(&device, Category::Activation), expected);
    assert_eq!(held(&device, Category::Temporary), 0);

    let mut grads = Gradients::new();
    p.bind_grads(&mut grads).unwrap();
    tape.backward(&loss, &mut grads).unwrap();
    // The tape is consumed and every saved tensor freed; the kept loss holds only its own block.
    assert!(tape.is_empty());
    assert_eq!(held(&device, Category::Activation), block(4));
    assert_eq!(held(&device, Category::Temporary), 0);
    // Gradients live in the block's flat buffer: exactly as many bytes as the parameters.
    // P = 10·50 + 50 + 50·30 + 30 = 2080 floats = 8320 bytes → 8704.
    assert_eq!(held(&device, Category::Parameter), block(2080 * 4));
    assert_eq!(
        held(&device, Category::Gradient),
        held(&device, Category::Parameter)
    );
    assert!(
        p.grad("w1")
            .unwrap()
            .to_vec_f32()
            .unwrap()
            .iter()
            .any(|&g| g != 0.0)
    );
    drop(loss);
    assert_eq!(held(&device, Category::Activation), 0);
}

#[test]
fn a_kept_loss_retains_nothing_once_the_tape_is_gone() {
    let device = device();
    let p = mlp_params(&device);
    let x = tensor(&device, &[B, D_IN], &values(B * D_IN, 2, -1.0, 1.0));
    let y = ids(&device, &[B], &[1, 2, 3, 4, 5, 6]);
    let tape = Tape::new();
    let loss = tape.record(|| mlp_loss(&p, &x, &y)).unwrap();
    assert!(held(&device, Category::Activation) > block(4));
    // Dropping the recorded ops (no backward) frees all saved activations although the loss,
    // an output of the graph, is still alive: tensors do not own the graph.
    tape.clear();
    assert_eq!(held(&device, Category::Activation), block(4));
    assert!(loss.to_scalar_f32().unwrap().is_finite());
}

#[test]
fn evaluation_under_no_grad_saves_nothing() {
    let device = device();
    let p = mlp_params(&device);
    let x = tensor(&device, &[B, D_IN], &values(B * D_IN, 3, -1.0, 1.0));
    let y = ids(&device, &[B], &[1, 2, 3, 4, 5, 6]);
    let tape = Tape::new();
    let loss = tape.record(|| no_grad(|| mlp_loss(&p, &x, &y))).unwrap();
    assert!(tape.is_empty());
    assert!(!loss.requires_grad());
    // Only the loss itself is held.
    assert_eq!(held(&device, Category::Activation), block(4));
}

#[test]
fn unbound_leaf_gradients_match_their_leaves_bytes() {
    // Parameters allocated one by one get gradients allocated one by one, of equal size.
    let device = device();
    let w1 = Tensor::zeros(
        &device,
        &[D_IN, HID],
        DType::F32,
        Category::Parameter,
        Some("w1"),
    )
    .unwrap()
    .track();
    let w2 = Tensor::zeros(
        &device,
        &[HID, D_OUT],
        DType::F32,
        Category::Parameter,
        Some("w2"),
    )
    .unwrap()
    .track();
    w1.copy_from_f32(&values(D_IN * HID, 5, -0.5, 0.5)).unwrap();
    w2.copy_from_f32(&values(HID * D_OUT, 6, -0.5, 0.5))
        .unwrap();
    let x = tensor(&device, &[B, D_IN], &values(B * D_IN, 7, -1.0, 1.0));
    let y = ids(&device, &[B], &[1, 2, 3, 4, 5, 6]);
    let tape = Tape::new();
    let loss = tape
        .record(|| x.matmul(&w1)?.gelu()?.matmul(&w2)?.cross_entropy(&y))
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    assert_eq!(grads.len(), 2);
    assert_eq!(
        held(&device, Category::Gradient),
        held(&device, Category::Parameter)
    );
    assert_eq!(grads.get(&w1).unwrap().category(), Category::Gradient);
}

// ---------------------------------------------------------------------------------------------
// A pre-norm transformer block, one attention head:
//   r1 = x + proj(softmax(causal(q kᵀ / √C)) v),  (q, k, v) = split(ln1(x) Wqkv + bqkv)
//   out = r1 + W2 gelu(W1 ln2(r1) + b1) + b2

const BATCH: usize = 2;
const T: usize = 5;
const C: usize = 12;

fn block_params(device: &Device) -> ParamBlock {
    let p = ParamBlock::new(
        device,
        "block.0",
        &[
            ("ln1.w", &[C]),
            ("ln1.b", &[C]),
            ("qkv.w", &[C, 3 * C]),
            ("qkv.b", &[3 * C]),
            ("proj.w", &[C, C]),
            ("proj.b", &[C]),
            ("ln2.w", &[C]),
            ("ln2.b", &[C]),
            ("fc.w", &[C, 4 * C]),
            ("fc.b", &[4 * C]),
            ("fc2.w", &[4 * C, C]),
            ("fc2.b", &[C]),
        ],
        DType::F32,
    )
    .unwrap();
    init(&p, 60);
    p
}

/// The block as a `'static` closure over its weight views (as a checkpoint scope needs).
fn block_fn(p: &ParamBlock) -> impl Fn(&[Tensor]) -> headroom_tensor::Result<Tensor> + 'static {
    let w: Vec<Tensor> = p.params().to_vec();
    move |xs: &[Tensor]| {
        let x = &xs[0]; // (B, T, C)
        let h = x.layer_norm(&w[0], &w[1], 1e-5)?; // (B, T, C)
        let qkv = h.matmul(&w[2])?.add(&w[3])?; // (B, T, 3C)
        let (q, k, v) = (
            qkv.narrow(2, 0, C)?,
            qkv.narrow(2, C, C)?,
            qkv.narrow(2, 2 * C, C)?,
        ); // (B, T, C) views
        let att = q
            .matmul(&k.transpose(-1, -2)?)?
            .scale(1.0 / (C as f32).sqrt())?
            .causal_mask()?
            .softmax()?; // (B, T, T)
        let r1 = x.add(&att.matmul(&v)?.matmul(&w[4])?.add(&w[5])?)?; // (B, T, C)
        let m = r1
            .layer_norm(&w[6], &w[7], 1e-5)?
            .matmul(&w[8])?
            .add(&w[9])?
            .gelu()?; // (B, T, 4C)
        r1.add(&m.matmul(&w[10])?.add(&w[11])?) // (B, T, C)
    }
}

fn block_input(device: &Device) -> Tensor {
    tensor(
        device,
        &[BATCH, T, C],
        &values(BATCH * T * C, 70, -1.0, 1.0),
    )
}

#[test]
fn transformer_block_activation_bytes_match_the_op_rules() {
    let device = device();
    let p = block_params(&device);
    let x = block_input(&device);
    let f = block_fn(&p);
    let tape = Tape::new();
    let (out, loss) = tape
        .record(|| {
            let out = f(std::slice::from_ref(&x))?;
            let loss = out.mean_all()?;
            Ok::<_, headroom_tensor::TensorError>((out, loss))
        })
        .unwrap();

    // What the tape keeps (x is an input and the weights are parameters: 0 activation bytes).
    let btc = block(BATCH * T * C * 4); //     480 →  512
    let stats = block(BATCH * T * 4); //        40 →  512  (one (B·T,) f32 row statistic)
    let expected = 2 * stats   // ln1: mean and rstd (it also saves x and its weight)
        + btc                  // ln1 output h: saved by the qkv matmul (for d Wqkv)
        + block(BATCH * T * 3 * C * 4) // qkv (B, T, 3C) = 1440 → 1536: q, k, v are views of it,
                               // saved by q kᵀ and by att·v; the pre-bias product is freed
        + block(BATCH * T * T * 4)     // softmax output (B, T, T) = 200 → 512, saved by softmax
                               // and att·v (one storage); the scaled and masked scores are freed
        + btc                  // att·v output: saved by the proj matmul
        + btc                  // r1: saved by ln2 (the residual add saves nothing)
        + 2 * stats            // ln2: mean and rstd
        + btc                  // ln2 output: saved by the fc matmul
        + block(BATCH * T * 4 * C * 4) // fc + bias (B, T, 4C) = 1920 → 2048: saved by gelu
        + block(BATCH * T * 4 * C * 4) // gelu output: saved by the fc2 matmul
        + btc                  // the block output, held by the caller
        + block(4); //                   the loss, held by the caller (mean saves nothing)
    assert_eq!(expected, 11264);
    assert_eq!(held(&device, Category::Activation), expected);

    let mut grads = Gradients::new();
    p.bind_grads(&mut grads).unwrap();
    drop(out);
    tape.backward(&loss, &mut grads).unwrap();
    assert_eq!(held(&device, Category::Activation), block(4));
    assert_eq!(held(&device, Category::Temporary), 0);
    assert_eq!(
        held(&device, Category::Gradient),
        held(&device, Category::Parameter)
    );
    drop(loss);
    assert_eq!(held(&device, Category::Activation), 0);
}

#[test]
fn checkpointed_block_keeps_only_its_input_and_gives_the_same_gradients() {
    let device = device();
    let p = block_params(&device);
    let x = block_input(&device).track();

    let run = |checkpointed: bool| -> (i64, Vec<f32>, Vec<f32>) {
        p.zero_grad().unwrap();
        let tape = Tape::new();
        let loss = tape
            .record(|| {
                let out = if checkpointed {
                    checkpoint(&[&x], block_fn(&p))?
                } else {
                    block_fn(&p)(std::slice::from_ref(&x))?
                };
                out.mean_all()
            })
            .unwrap();
        let after_forward = held(&device, Category::Activation);
        let mut grads = Gradients::new();
        p.bind_grads(&mut grads).unwrap();
        tape.backward(&loss, &mut grads).unwrap();
        assert_eq!(held(&device, Category::Activation), block(4));
        let dx = grads.get(&x).unwrap().to_vec_f32().unwrap();
        (after_forward, p.flat_grad().to_vec_f32().unwrap(), dx)
    };
    let (plain_bytes, plain_grads, plain_dx) = run(false);
    let (ckpt_bytes, ckpt_grads, ckpt_dx) = run(true);
    // Checkpointed, the tape keeps the scope's input x (an input: 0 activation bytes); the
    // block output was freed after the mean (which saves nothing), so only the loss remains.
    assert_eq!(ckpt_bytes, block(4));
    assert_eq!(plain_bytes, 11264 - block(BATCH * T * C * 4));
    // The recompute runs the same kernels on the same inputs: bitwise equal gradients.
    assert_eq!(plain_grads, ckpt_grads);
    assert_eq!(plain_dx, ckpt_dx);
}

#[test]
fn out_of_memory_is_an_error_not_a_panic() {
    let device = Device::cpu(4 << 20, headroom_memory::AllocatorConfig::default());
    let a = Tensor::zeros(&device, &[512, 512], DType::F32, Category::Input, None).unwrap(); // 1 MiB
    // (512, 512) @ (512, 512) needs another 1 MiB per call; hold results until the 4 MiB run out.
    let mut kept = vec![];
    let err = loop {
        match a.matmul(&a) {
            Ok(t) => kept.push(t),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, headroom_tensor::TensorError::OutOfMemory(_)),
        "{err}"
    );
    assert!(err.to_string().contains("out of memory"));
}

#[test]
fn parameter_views_alias_the_flat_buffer_and_gradients_accumulate_across_backwards() {
    let device = device();
    let p = ParamBlock::new(&device, "lin", &[("w", &[2, 3]), ("b", &[3])], DType::F32).unwrap();
    p.param("w")
        .unwrap()
        .copy_from_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap();
    p.param("b")
        .unwrap()
        .copy_from_f32(&[7.0, 8.0, 9.0])
        .unwrap();
    // The flat buffer holds w then b, back to back.
    assert_eq!(
        p.flat().to_vec_f32().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    );
    assert_eq!(p.specs()[1].offset, 6);
    let x = tensor(&device, &[1, 2], &[1.0, -1.0]);
    let mut grads = Gradients::new();
    p.bind_grads(&mut grads).unwrap();
    for _ in 0..2 {
        let tape = Tape::new();
        // L = Σ (x W + b): dL/dW[i, j] = x[i], dL/db[j] = 1.
        let loss = tape
            .record(|| x.matmul(p.param("w")?)?.add(p.param("b")?)?.sum_all())
            .unwrap();
        tape.backward(&loss, &mut grads).unwrap();
    }
    // Two backward passes accumulate: dW = 2·[[1, 1, 1], [−1, −1, −1]], db = [2, 2, 2].
    assert_eq!(
        p.flat_grad().to_vec_f32().unwrap(),
        vec![2.0, 2.0, 2.0, -2.0, -2.0, -2.0, 2.0, 2.0, 2.0]
    );
    p.zero_grad().unwrap();
    assert!(
        p.grad("b")
            .unwrap()
            .to_vec_f32()
            .unwrap()
            .iter()
            .all(|&g| g == 0.0)
    );
}

#[test]
fn nested_checkpoints_give_the_plain_gradients() {
    let device = device();
    let w = tensor(&device, &[6, 6], &values(36, 80, -0.5, 0.5)).track();
    let x = tensor(&device, &[3, 6], &values(18, 81, -1.0, 1.0)).track();
    let run = |nested: bool| {
        let (w1, w2) = (w.clone(), w.clone());
        let inner = move |xs: &[Tensor]| xs[0].matmul(&w1)?.tanh();
        let tape = Tape::new();
        let loss = tape
            .record(|| {
                let y = if nested {
                    checkpoint(&[&x], move |xs| {
                        checkpoint(&[&xs[0]], inner.clone())?.matmul(&w2)?.silu()
                    })?
                } else {
                    inner(std::slice::from_ref(&x))?.matmul(&w)?.silu()?
                };
                y.sum_all()
            })
            .unwrap();
        let mut grads = Gradients::new();
        tape.backward(&loss, &mut grads).unwrap();
        (
            grads.get(&x).unwrap().to_vec_f32().unwrap(),
            grads.get(&w).unwrap().to_vec_f32().unwrap(),
        )
    };
    assert_eq!(run(false), run(true));
}

#[test]
fn flat_buffers_are_reachable_as_host_slices_for_an_optimizer() {
    let device = device();
    let p = ParamBlock::new(&device, "lin", &[("w", &[2, 2]), ("b", &[2])], DType::F32).unwrap();
    p.flat_grad()
        .copy_from_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap();
    assert_eq!(p.ranges(), vec![0..4, 4..6]);
    // An SGD step with lr 0.5 on zero weights: w = −0.5·g.
    p.flat()
        .with_slice_mut::<f32, _>(|w| {
            p.flat_grad()
                .with_slice::<f32, _>(|g| w.iter_mut().zip(g).for_each(|(w, g)| *w -= 0.5 * g))
                .unwrap()
        })
        .unwrap();
    assert_eq!(
        p.param("b").unwrap().to_vec_f32().unwrap(),
        vec![-2.5, -3.0]
    );
    assert!(p.flat().with_slice::<half::bf16, _>(|_| ()).is_err());
}
