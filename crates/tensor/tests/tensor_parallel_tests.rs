//! Tensor parallelism's linears: an MLP (column-parallel, GELU, row-parallel) and a fused
//! query/key/value projection split over 1, 2 and 4 ranks (threads) give bitwise the same loss,
//! the same input gradient on every rank, and each rank's weight gradients are bitwise the
//! slice of the unsplit ones; the unsplit run is a linear layer to rounding (against plain
//! `matmul`), so the chunked sums compute the right thing, not merely the same thing.

use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_tensor::{
    ChunkColumns, DType, Gradients, ShardGroup, Tape, Tensor, TensorParallel, autocast,
};
use std::sync::{Arc, Barrier, Mutex};

const CHUNKS: usize = 8;
const B: usize = 2;
const T: usize = 3;
const C: usize = 16;
const F: usize = 32;

/// An in-test group of threads: each rank writes its part, all wait, all read, all wait.
struct Shared {
    parts: Mutex<Vec<Vec<f32>>>,
    barrier: Barrier,
}

struct Member {
    rank: usize,
    world: usize,
    shared: Arc<Shared>,
}

impl ShardGroup for Member {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn all_gather(&self, part: &[f32]) -> Result<Vec<f32>, String> {
        self.shared.parts.lock().unwrap()[self.rank] = part.to_vec();
        self.shared.barrier.wait();
        let all = self.shared.parts.lock().unwrap().concat();
        self.shared.barrier.wait();
        Ok(all)
    }
    fn all_gather_without_data(&self, _elements: usize) -> Result<(), String> {
        Ok(())
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    // A small linear congruential sequence in [−0.5, 0.5): fixed, varied values.
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            ((s >> 8) as f32 / (1u32 << 24) as f32) - 0.5
        })
        .collect()
}

/// Columns `cols` (ranges) of a row-major `rows × width` matrix, side by side.
fn columns(m: &[f32], width: usize, cols: &[(usize, usize)]) -> Vec<f32> {
    m.chunks_exact(width)
        .flat_map(|row| cols.iter().flat_map(move |&(s, l)| row[s..s + l].to_vec()))
        .collect()
}

/// The unsplit weights: fc (C × F), fc bias, proj (F × C), proj bias, qkv (C × 3C), qkv bias.
struct Full {
    fc: Vec<f32>,
    fc_b: Vec<f32>,
    proj: Vec<f32>,
    proj_b: Vec<f32>,
    qkv: Vec<f32>,
    qkv_b: Vec<f32>,
    x: Vec<f32>,
    probe: Vec<f32>,
}

fn full() -> Full {
    Full {
        fc: values(C * F, 1),
        fc_b: values(F, 2),
        proj: values(F * C, 3),
        proj_b: values(C, 4),
        qkv: values(C * 3 * C, 5),
        qkv_b: values(3 * C, 6),
        x: values(B * T * C, 7),
        probe: values(B * T * C, 8),
    }
}

/// Rank r's columns of the MLP's first weight, and of the fused projection ([q_r | k_r | v_r]).
fn fc_cols(r: usize, t: usize) -> Vec<(usize, usize)> {
    vec![(r * F / t, F / t)]
}
fn qkv_cols(r: usize, t: usize) -> Vec<(usize, usize)> {
    (0..3).map(|p| (p * C + r * C / t, C / t)).collect()
}

/// The local chunks of rank r's fused projection: chunk j holds its query, key and value ranges.
fn qkv_chunks(t: usize) -> Vec<ChunkColumns> {
    let (w, per) = (C / CHUNKS, CHUNKS / t);
    (0..per)
        .map(|j| (0..3).map(|p| (p * C / t + j * w, w)).collect())
        .collect()
}
fn fc_chunks(t: usize) -> Vec<ChunkColumns> {
    let (w, per) = (F / CHUNKS, CHUNKS / t);
    (0..per).map(|j| vec![(j * w, w)]).collect()
}

struct Outcome {
    loss: u32,
    dx: Vec<u32>,
    fc: Vec<u32>,
    proj: Vec<u32>,
    qkv: Vec<u32>,
    qkv_b: Vec<u32>,
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec_f32()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Rank r of t: loss = Σ probe ⊙ (mlp(x) + qkv's query part summed over ranks).
fn rank_run(r: usize, t: usize, group: Arc<dyn ShardGroup>, dtype: DType, cast: bool) -> Outcome {
    let f = full();
    let device = Device::cpu(64 << 20, AllocatorConfig::default());
    let wdtype = if cast { DType::F32 } else { dtype };
    let new = |shape: &[usize], v: &[f32]| {
        Tensor::from_f32(&device, shape, v, wdtype, Category::Parameter, None)
            .unwrap()
            .track()
    };
    let tp = TensorParallel::new(group, CHUNKS).unwrap();
    let fcc = fc_cols(r, t);
    let fc = new(&[C, F / t], &columns(&f.fc, F, &fcc));
    let fc_b = new(&[F / t], &columns(&f.fc_b, F, &fcc));
    let proj = new(&[F / t, C], &f.proj[r * F / t * C..(r + 1) * F / t * C]);
    let proj_b = new(&[C], &f.proj_b);
    let qc = qkv_cols(r, t);
    let qkv = new(&[C, 3 * C / t], &columns(&f.qkv, 3 * C, &qc));
    let qkv_b = new(&[3 * C / t], &columns(&f.qkv_b, 3 * C, &qc));
    let x = new(&[B, T, C], &f.x);
    let probe = Tensor::from_f32(
        &device,
        &[B, T, C],
        &f.probe,
        DType::F32,
        Category::Input,
        None,
    )
    .unwrap();
    let tape = Tape::new();
    let forward = || -> headroom_tensor::Result<Tensor> {
        let h = x.column_parallel_linear(&fc, Some(&fc_b), &tp, &fc_chunks(t))?;
        let y = h.gelu()?.row_parallel_linear(&proj, Some(&proj_b), &tp)?;
        let a = x.column_parallel_linear(&qkv, Some(&qkv_b), &tp, &qkv_chunks(t))?;
        // This rank's query heads (the first C/t columns) back through a row-parallel product
        // with the identity's rows: the sum over ranks is every head's query.
        let q = a.narrow(2, 0, C / t)?;
        let eye: Vec<f32> = (0..C / t)
            .flat_map(|i| (0..C).map(move |j| f32::from(j == r * C / t + i)))
            .collect();
        let eye = Tensor::from_f32(&device, &[C / t, C], &eye, q.dtype(), Category::Input, None)?;
        let q = q.row_parallel_linear(&eye, None, &tp)?;
        let out = y.add(&q)?;
        out.cast(DType::F32)?.mul(&probe)?.sum_all()
    };
    let loss = tape
        .record(|| match cast {
            true => autocast(dtype, forward),
            false => forward(),
        })
        .unwrap();
    let mut grads = Gradients::new();
    tape.backward(&loss, &mut grads).unwrap();
    let g = |p: &Tensor| bits(&grads.get(p).unwrap().cast(DType::F32).unwrap());
    Outcome {
        loss: loss.to_scalar_f32().unwrap().to_bits(),
        dx: g(&x),
        fc: g(&fc),
        proj: g(&proj),
        qkv: g(&qkv),
        qkv_b: g(&qkv_b),
    }
}

fn run(t: usize, dtype: DType, cast: bool) -> Vec<Outcome> {
    let shared = Arc::new(Shared {
        parts: Mutex::new(vec![Vec::new(); t]),
        barrier: Barrier::new(t),
    });
    let handles: Vec<_> = (0..t)
        .map(|rank| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                let group: Arc<dyn ShardGroup> = Arc::new(Member {
                    rank,
                    world: t,
                    shared,
                });
                rank_run(rank, t, group, dtype, cast)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn u32_columns(m: &[u32], width: usize, cols: &[(usize, usize)]) -> Vec<u32> {
    m.chunks_exact(width)
        .flat_map(|row| cols.iter().flat_map(move |&(s, l)| row[s..s + l].to_vec()))
        .collect()
}

fn check_split_equals_unsplit(dtype: DType, cast: bool) {
    let one = run(1, dtype, cast).pop().unwrap();
    for t in [2, 4] {
        for (r, o) in run(t, dtype, cast).iter().enumerate() {
            let case = format!("{dtype} autocast {cast}, rank {r} of {t}");
            assert_eq!(o.loss, one.loss, "loss, {case}");
            assert_eq!(o.dx, one.dx, "input gradient, {case}");
            assert_eq!(o.fc, u32_columns(&one.fc, F, &fc_cols(r, t)), "fc, {case}");
            let rows = F / t * C;
            assert_eq!(o.proj, one.proj[r * rows..(r + 1) * rows], "proj, {case}");
            assert_eq!(
                o.qkv,
                u32_columns(&one.qkv, 3 * C, &qkv_cols(r, t)),
                "qkv, {case}"
            );
            assert_eq!(
                o.qkv_b,
                u32_columns(&one.qkv_b, 3 * C, &qkv_cols(r, t)),
                "qkv bias, {case}"
            );
        }
    }
}

#[test]
fn fp32_split_over_two_and_four_ranks_is_bitwise_the_unsplit_run() {
    check_split_equals_unsplit(DType::F32, false);
}

#[test]
fn bf16_split_over_two_and_four_ranks_is_bitwise_the_unsplit_run() {
    check_split_equals_unsplit(DType::BF16, false);
}

#[test]
fn bf16_autocast_split_is_bitwise_the_unsplit_run() {
    check_split_equals_unsplit(DType::BF16, true);
}

#[test]
fn the_unsplit_chunked_linears_are_linear_layers() {
    // tp = 1: the MLP and projection against plain matmuls of the same f32 values; the chunked
    // sums only reorder additions, so the results agree to f32 rounding (|Δ| ≤ 1e-5 for sums
    // of 16 to 32 products of magnitude ≤ 0.25).
    let f = full();
    let device = Device::cpu(64 << 20, AllocatorConfig::default());
    let new = |shape: &[usize], v: &[f32]| {
        Tensor::from_f32(&device, shape, v, DType::F32, Category::Parameter, None).unwrap()
    };
    let shared = Arc::new(Shared {
        parts: Mutex::new(vec![Vec::new()]),
        barrier: Barrier::new(1),
    });
    let group: Arc<dyn ShardGroup> = Arc::new(Member {
        rank: 0,
        world: 1,
        shared,
    });
    let tp = TensorParallel::new(group, CHUNKS).unwrap();
    let x = new(&[B * T, C], &f.x);
    let (fc, fc_b) = (new(&[C, F], &f.fc), new(&[F], &f.fc_b));
    let (proj, proj_b) = (new(&[F, C], &f.proj), new(&[C], &f.proj_b));
    let h = x
        .column_parallel_linear(&fc, Some(&fc_b), &tp, &fc_chunks(1))
        .unwrap();
    let y = h.row_parallel_linear(&proj, Some(&proj_b), &tp).unwrap();
    let plain = x.matmul(&fc).unwrap().add(&fc_b).unwrap();
    let plain = plain.matmul(&proj).unwrap().add(&proj_b).unwrap();
    let (y, plain) = (y.to_vec_f32().unwrap(), plain.to_vec_f32().unwrap());
    for (a, b) in y.iter().zip(&plain) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
}

#[test]
fn a_group_size_that_does_not_divide_the_chunks_is_refused() {
    let shared = Arc::new(Shared {
        parts: Mutex::new(vec![Vec::new(); 3]),
        barrier: Barrier::new(3),
    });
    let group: Arc<dyn ShardGroup> = Arc::new(Member {
        rank: 0,
        world: 3,
        shared,
    });
    let err = TensorParallel::new(group, CHUNKS).unwrap_err().to_string();
    assert!(err.contains("8 reduction chunks over 3 ranks"), "{err}");
}
