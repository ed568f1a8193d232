//! Same inputs and seed twice → bitwise identical outputs and gradients, with dropout in the
//! graph and sizes large enough that kernels run on several rayon threads.

use crate::common;

use common::{device, ids, tensor, values};
use headroom_tensor::{Gradients, Tape, Tensor, rng};

fn step(seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let device = device();
    let w = tensor(&device, &[256, 300], &values(256 * 300, 1, -0.1, 0.1)).track();
    let g = tensor(&device, &[300], &values(300, 2, 0.5, 1.5)).track();
    let b = tensor(&device, &[300], &values(300, 3, -0.1, 0.1)).track();
    let x = tensor(&device, &[4, 64, 256], &values(4 * 64 * 256, 4, -1.0, 1.0));
    let y = ids(
        &device,
        &[4, 64],
        &(0..256).map(|i| (i * 37 % 300) as i64).collect::<Vec<_>>(),
    );
    rng::manual_seed(seed);
    let tape = Tape::new();
    let (logits, loss) = tape
        .record(|| {
            let logits = x
                .matmul(&w)?
                .layer_norm(&g, &b, 1e-5)?
                .gelu()?
                .dropout(0.1)?; // (4, 64, 300)
            let loss = logits.cross_entropy(&y)?;
            Ok::<_, headroom_tensor::TensorError>((logits, loss))
        })
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let out = logits.to_vec_f32().unwrap();
    let dw = grads.get(&w).unwrap().to_vec_f32().unwrap();
    let dg = grads.get(&g).unwrap().to_vec_f32().unwrap();
    (out, dw, dg)
}

#[test]
fn same_seed_gives_bitwise_identical_outputs_and_gradients() {
    let (a_out, a_dw, a_dg) = step(42);
    let (b_out, b_dw, b_dg) = step(42);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a_out), bits(&b_out));
    assert_eq!(bits(&a_dw), bits(&b_dw));
    assert_eq!(bits(&a_dg), bits(&b_dg));
    // A different seed draws a different dropout mask.
    let (c_out, _, _) = step(43);
    assert_ne!(bits(&a_out), bits(&c_out));
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Every output element is computed by one fixed sequence of operations; only the split of
    // elements among threads changes.
    let single = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let (a_out, a_dw, _) = single.install(|| step(5));
    let (b_out, b_dw, _) = step(5);
    assert_eq!(a_out, b_out);
    assert_eq!(a_dw, b_dw);
}

#[test]
fn a_batch_run_side_by_side_gives_each_products_bits_computed_alone() {
    // On two threads a batch of 8 products of 128×96·96×128 (1.57 M multiply-adds each, above
    // the size where one product is split over the pool) runs its products side by side, each
    // on one thread; each product alone runs split over both threads. The bits must agree.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let device = device();
    let (batch, m, k, n) = (8, 128, 96, 128);
    let a = tensor(
        &device,
        &[batch, m, k],
        &values(batch * m * k, 11, -1.0, 1.0),
    );
    let b = tensor(
        &device,
        &[batch, k, n],
        &values(batch * k * n, 12, -1.0, 1.0),
    );
    let together = pool.install(|| a.matmul(&b).unwrap().to_vec_f32().unwrap());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for i in 0..batch {
        let ai = tensor(
            &device,
            &[m, k],
            &values(batch * m * k, 11, -1.0, 1.0)[i * m * k..][..m * k],
        );
        let bi = tensor(
            &device,
            &[k, n],
            &values(batch * k * n, 12, -1.0, 1.0)[i * k * n..][..k * n],
        );
        let alone = pool.install(|| ai.matmul(&bi).unwrap().to_vec_f32().unwrap());
        assert_eq!(
            bits(&together[i * m * n..][..m * n]),
            bits(&alone),
            "product {i}"
        );
    }
}

#[test]
fn tensors_are_dropped_when_scopes_end() {
    let device = device();
    {
        let _t = Tensor::zeros(
            &device,
            &[1000],
            headroom_tensor::DType::F32,
            headroom_memory::Category::Activation,
            None,
        )
        .unwrap();
        assert_eq!(device.stats().allocated_bytes.all.current, 4096);
    }
    assert_eq!(device.stats().allocated_bytes.all.current, 0);
}
