//! Tensor parallelism's two linears (Megatron-LM: Shoeybi et al. 2019, arXiv:1909.08053 §3):
//! a column-parallel linear holds a slice of the output columns and reads the whole input (its
//! backward sums the input gradient over ranks), a row-parallel linear holds a slice of the
//! input rows and reads the matching slice of the input (its forward sums the output over
//! ranks). A rank's group is a [`TensorParallel`]: its place and the transport behind
//! [`ShardGroup`] (the comm crate implements it over its communicators).
//!
//! Every sum over the reduced dimension is cut into a fixed number of chunks, each a product
//! of the same shape at every group size, summed as a pairwise tree whose leaves are the chunks
//! in order. A rank of a group of `t` holds `chunks / t` consecutive chunks, sums its subtree,
//! and the ranks' partials are gathered and summed pairwise in rank order: the tree continues,
//! so with `t` a power of two dividing `chunks` every group size adds the same numbers in the
//! same order, and a run on 1, 2 or 4 ranks is bitwise the same. Each product has the same
//! shape at every group size too, so no kernel sees a different geometry. The partials meet in
//! the compute dtype, each pair added by `Tensor::add` wherever it is added.
//!
//! Not for: which layers are split (the nn crate's modules) or moving bytes (the comm crate).

use crate::autocast;
use crate::backprop::Op;
use crate::context::no_grad;
use crate::error::{Result, TensorError};
use crate::tape::{record, will_record};
use crate::tensor::Tensor;
use std::sync::Arc;

/// One rank's view of its tensor-parallel group: the transport the linears' sums run over.
pub trait ShardGroup: Send + Sync {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// Every rank's `part` (of equal lengths), back to back in rank order.
    fn all_gather(&self, part: &[f32]) -> std::result::Result<Vec<f32>, String>;
    /// A dry run's all-gather of `elements` per rank: counted, nothing moved.
    fn all_gather_without_data(&self, elements: usize) -> std::result::Result<(), String>;
}

/// A rank of a tensor-parallel group and the chunking of its sums.
#[derive(Clone)]
pub struct TensorParallel {
    group: Arc<dyn ShardGroup>,
    /// Chunks of every reduced dimension over the whole group (a power of two).
    chunks: usize,
}

impl std::fmt::Debug for TensorParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorParallel")
            .field("rank", &self.rank())
            .field("world", &self.world())
            .field("chunks", &self.chunks)
            .finish()
    }
}

impl TensorParallel {
    /// Rank `group.rank()` of `group.world()`, every reduced dimension summed in `chunks`
    /// chunks. `chunks` must be a power of two that the world size divides.
    pub fn new(group: Arc<dyn ShardGroup>, chunks: usize) -> Result<TensorParallel> {
        let world = group.world();
        if !chunks.is_power_of_two() || world == 0 || !chunks.is_multiple_of(world) {
            return Err(TensorError::invalid(
                "tensor_parallel",
                format!(
                    "{chunks} reduction chunks over {world} ranks: the chunk count must be a power of two and a multiple of the tensor-parallel size; use a power-of-two size of at most {chunks}"
                ),
            ));
        }
        Ok(TensorParallel { group, chunks })
    }

    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    pub fn world(&self) -> usize {
        self.group.world()
    }

    /// Chunks over the whole group.
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Chunks this rank holds.
    pub fn chunks_per_rank(&self) -> usize {
        self.chunks / self.world()
    }

    /// The sum over ranks of every rank's `partial` (its subtree of the chunks), continuing the
    /// pairwise tree over the ranks in rank order. Each rank's partial arrives in a tensor of
    /// its own (`tp.partial`), on a dry run's device too, so both count the same bytes.
    fn gather_tree(&self, partial: &Tensor) -> Result<Tensor> {
        let (rank, world) = (self.rank(), self.world());
        if world == 1 {
            return Ok(partial.clone());
        }
        let n = partial.numel();
        let device = partial.device();
        let failed = |e: String| TensorError::invalid("tensor_parallel", e);
        let gathered = match device.is_backed() {
            true => Some(
                self.group
                    .all_gather(&partial.to_vec_f32()?)
                    .map_err(failed)?,
            ),
            false => {
                self.group.all_gather_without_data(n).map_err(failed)?;
                None
            }
        };
        let parts = (0..world)
            .map(|r| {
                if r == rank {
                    return Ok(partial.clone());
                }
                let t = Tensor::empty(&device, partial.shape(), partial.dtype(), "tp.partial")?;
                if let Some(all) = &gathered {
                    t.copy_from_f32(&all[r * n..(r + 1) * n])?;
                }
                Ok(t)
            })
            .collect::<Result<Vec<_>>>()?;
        tree_sum(&parts)
    }
}

/// `parts` summed as a pairwise tree: the first half's sum plus the second half's (a power of
/// two of parts keeps every subtree aligned).
pub fn tree_sum(parts: &[Tensor]) -> Result<Tensor> {
    match parts {
        [] => Err(TensorError::invalid("tree_sum", "nothing to sum")),
        [one] => Ok(one.clone()),
        _ => {
            let (a, b) = parts.split_at(parts.len() / 2);
            tree_sum(a)?.add(&tree_sum(b)?)
        }
    }
}

/// The column ranges `(start, len)` of one chunk of a column-parallel weight (several where
/// the layer fuses projections: a query, key and value range each).
pub type ChunkColumns = Vec<(usize, usize)>;

/// Folds a batched input to rows, runs `f` and unfolds the output's leading dimensions.
fn folded(x: &Tensor, n: usize, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let r = x.rank();
    if r <= 2 {
        return f(x);
    }
    let lead = &x.shape()[..r - 1];
    let rows = x.reshape(&[lead.iter().product(), x.shape()[r - 1]])?;
    let mut out_shape = lead.to_vec();
    out_shape.push(n);
    f(&rows)?.reshape(&out_shape)
}

/// `x` (…, K) against a weight (K × N).
fn check_shapes(op: &'static str, x: &Tensor, w: &Tensor) -> Result<()> {
    if w.rank() != 2 || x.shape().last() != Some(&w.shape()[0]) {
        return Err(TensorError::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: w.shape().to_vec(),
        });
    }
    Ok(())
}

impl Tensor {
    /// `self @ w + b` for a column-parallel weight `w` (K × this rank's columns): `chunks` lists
    /// this rank's chunks of columns (`TensorParallel::chunks_per_rank` of them, each one or
    /// more ranges). Each range is its own product; the input gradient is summed over the
    /// chunks as a tree and then over the ranks.
    pub fn column_parallel_linear(
        &self,
        w: &Tensor,
        b: Option<&Tensor>,
        tp: &TensorParallel,
        chunks: &[ChunkColumns],
    ) -> Result<Tensor> {
        check_shapes("column_parallel_linear", self, w)?;
        if chunks.len() != tp.chunks_per_rank() {
            return Err(TensorError::invalid(
                "column_parallel_linear",
                format!(
                    "{} chunks given, the group holds {} per rank",
                    chunks.len(),
                    tp.chunks_per_rank()
                ),
            ));
        }
        if let Some((x, w)) = autocast::lower_pair(self, w)? {
            return x.column_parallel_linear(&w, b, tp, chunks);
        }
        let b = b.map(autocast::lower_bias).transpose()?;
        let n = w.shape()[1];
        let mut ranges: Vec<(usize, usize)> = chunks.iter().flatten().copied().collect();
        ranges.sort_unstable();
        if ranges.iter().map(|r| r.1).sum::<usize>() != n
            || ranges.windows(2).any(|p| p[0].0 + p[0].1 != p[1].0)
        {
            return Err(TensorError::invalid(
                "column_parallel_linear",
                format!("the chunks' columns {ranges:?} must tile the weight's {n} columns"),
            ));
        }
        folded(self, n, |x| {
            let out = no_grad(|| {
                let pieces = ranges
                    .iter()
                    .map(|&(s, l)| {
                        let wp = w.narrow(1, s, l)?;
                        match &b {
                            Some(b) => x.linear(&wp, &b.narrow(0, s, l)?),
                            None => x.matmul(&wp),
                        }
                    })
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat(&pieces.iter().collect::<Vec<_>>(), 1)
            })?;
            let keep = will_record(&[x, w]);
            let mut inputs = vec![x, w];
            if let Some(b) = &b {
                inputs.push(b);
            }
            Ok(record(out, &inputs, || Op::ColumnParallelLinear {
                x: (keep && w.requires_grad()).then(|| x.clone()),
                w: (keep && x.requires_grad()).then(|| w.clone()),
                ranges,
                chunks: chunks.to_vec(),
                tp: tp.clone(),
            }))
        })
    }

    /// `self @ w + b` for a row-parallel weight `w` (this rank's rows × N) and `self` this
    /// rank's slice of the input features: the rank's chunks of rows are separate products
    /// summed as a tree, the ranks' sums meet in [`Tensor::sum_over_ranks`], and the
    /// (replicated) bias is added after.
    pub fn row_parallel_linear(
        &self,
        w: &Tensor,
        b: Option<&Tensor>,
        tp: &TensorParallel,
    ) -> Result<Tensor> {
        let per_rank = tp.chunks_per_rank();
        check_shapes("row_parallel_linear", self, w)?;
        if let Some((x, w)) = autocast::lower_pair(self, w)? {
            return x.row_parallel_linear(&w, b, tp);
        }
        let (rows, n) = (w.shape()[0], w.shape()[1]);
        if !rows.is_multiple_of(per_rank) {
            return Err(TensorError::invalid(
                "row_parallel_linear",
                format!("{rows} rows do not split into {per_rank} chunks"),
            ));
        }
        let k = rows / per_rank;
        let y = folded(self, n, |x| {
            let parts = (0..per_rank)
                .map(|j| x.narrow(1, j * k, k)?.matmul(&w.narrow(0, j * k, k)?))
                .collect::<Result<Vec<_>>>()?;
            tree_sum(&parts)?.sum_over_ranks(tp)
        })?;
        match b {
            Some(b) => y.add(&autocast::lower_bias(b)?),
            None => Ok(y),
        }
    }

    /// The sum over the ranks of `tp` of each rank's `self`, in rank order as a pairwise tree.
    /// Its gradient is the output's (each rank's partial enters the sum once).
    pub fn sum_over_ranks(&self, tp: &TensorParallel) -> Result<Tensor> {
        let out = no_grad(|| tp.gather_tree(self))?;
        Ok(record(out, &[self], || Op::SumOverRanks))
    }
}

/// The column-parallel linear's gradients `[dx, dw, db]`: `dw` and `db` range by range (the
/// forward's products, transposed), `dx` as the tree over this rank's chunks (each chunk's
/// ranges side by side in one product) and then over the ranks.
pub(crate) fn column_parallel_backward(
    x: Option<&Tensor>,
    w: Option<&Tensor>,
    ranges: &[(usize, usize)],
    chunks: &[ChunkColumns],
    tp: &TensorParallel,
    dy: &Tensor,
    want_bias: bool,
) -> Result<Vec<Option<Tensor>>> {
    let side_by_side = |t: &Tensor, cols: &[(usize, usize)]| -> Result<Tensor> {
        let pieces = cols
            .iter()
            .map(|&(s, l)| t.narrow(1, s, l))
            .collect::<Result<Vec<_>>>()?;
        match pieces.as_slice() {
            [one] => Ok(one.clone()),
            _ => Tensor::cat(&pieces.iter().collect::<Vec<_>>(), 1),
        }
    };
    let db = want_bias
        .then(|| {
            let pieces = ranges
                .iter()
                .map(|&(s, l)| dy.narrow(1, s, l)?.sum_to(&[l]))
                .collect::<Result<Vec<_>>>()?;
            Tensor::cat(&pieces.iter().collect::<Vec<_>>(), 0)
        })
        .transpose()?;
    let dx = w
        .map(|w| -> Result<Tensor> {
            let parts = chunks
                .iter()
                .map(|cols| {
                    side_by_side(dy, cols)?.matmul(&side_by_side(w, cols)?.transpose(0, 1)?)
                })
                .collect::<Result<Vec<_>>>()?;
            tp.gather_tree(&tree_sum(&parts)?)
        })
        .transpose()?;
    let dw = x
        .map(|x| -> Result<Tensor> {
            let xt = x.transpose(0, 1)?;
            let pieces = ranges
                .iter()
                .map(|&(s, l)| xt.matmul(&dy.narrow(1, s, l)?))
                .collect::<Result<Vec<_>>>()?;
            Tensor::cat(&pieces.iter().collect::<Vec<_>>(), 1)
        })
        .transpose()?;
    Ok(vec![dx, dw, db])
}
