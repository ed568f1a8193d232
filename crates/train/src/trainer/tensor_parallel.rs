//! A trainer as one rank of a tensor-parallel group: the communicator becomes the group the
//! model's split linears sum over (`TensorParallelGroup`), every rank reads the same batches,
//! and the gradient's global norm (for clipping, and finiteness for the loss scaler) is summed
//! so that every group size adds the same numbers in the same order: each split weight's
//! squares are summed per reduction chunk (a block of columns of each part, or of rows, the same
//! elements in the same order at every size), each rank sends its chunks' sums, and every rank
//! adds all chunks' sums in the unsplit layout's order. The whole weights (norms, embeddings,
//! head, the row-parallel biases) are identical on every rank and are summed locally.
//!
//! Not for: the split (the nn crate's GPT) or the linears' sums (the tensor crate).

use super::{TrainError, Trainer};
use crate::config::RunConfig;
use headroom_comm::{Collective, Communicator, TensorParallelGroup};
use headroom_nn::grad::GradStats;
use headroom_nn::models::gpt::{SlotSplit, slot_split};
use headroom_tensor::{ParamBlock, ShardGroup, TensorParallel};
use std::sync::Arc;

/// A tensor-parallel run's communicator as its group (none for a run whole): rank `comm`'s, or
/// alone a group of one. The data-parallel communicator is then none.
#[allow(clippy::type_complexity)]
pub(super) fn split_comm(
    config: &RunConfig,
    comm: Option<Box<dyn Communicator>>,
    dry: bool,
) -> Result<
    (
        Option<Box<dyn Communicator>>,
        Option<Arc<TensorParallelGroup>>,
    ),
    TrainError,
> {
    let Some(n) = config.tensor_parallel else {
        return Ok((comm, None));
    };
    let comm = comm.unwrap_or_else(|| super::group::solo_rank(config, dry));
    if comm.world_size() != n {
        return Err(TrainError::Engine(headroom_tensor::TensorError::invalid(
            "tensor parallelism",
            format!(
                "the group has {} ranks and the run splits the model over {n}; launch {n} ranks",
                comm.world_size()
            ),
        )));
    }
    Ok((None, Some(Arc::new(TensorParallelGroup::new(comm)))))
}

/// The model's view of the group: its sums cut into `config`'s chunks.
pub(super) fn tensor_parallel(
    config: &RunConfig,
    group: &Arc<TensorParallelGroup>,
) -> Result<TensorParallel, TrainError> {
    let group: Arc<dyn ShardGroup> = group.clone();
    Ok(TensorParallel::new(group, config.tensor_parallel_chunks())?)
}

/// An f64 as four 16-bit pieces, each exact in an f32 (the communicators move f32).
fn encode(v: f64) -> [f32; 4] {
    let b = v.to_bits();
    std::array::from_fn(|i| ((b >> (16 * i)) & 0xffff) as f32)
}

fn decode(p: &[f32]) -> f64 {
    f64::from_bits((0..4).fold(0u64, |b, i| b | ((p[i] as u64) << (16 * i))))
}

/// Σ x² over `values[rows × width]`'s columns `cols` of rows `rows`, row-major.
fn squares(
    values: &[f32],
    width: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) -> f64 {
    rows.flat_map(|r| values[r * width + cols.start..r * width + cols.end].iter())
        .map(|&x| (x as f64) * (x as f64))
        .sum()
}

/// One block's squares: each whole slot's sum (`whole`, in slot order) and each split slot's
/// chunk sums of this rank (`split`, in slot order, part by part, chunk by chunk); with each
/// split slot, how many parts it has.
struct BlockSquares {
    whole: Vec<f64>,
    split: Vec<f64>,
    all_finite: bool,
}

fn block_squares(block: &ParamBlock, per_rank: usize) -> Result<BlockSquares, TrainError> {
    let grads = block.flat_grad().to_vec_f32()?;
    let mut out = BlockSquares {
        whole: Vec::new(),
        split: Vec::new(),
        all_finite: grads.iter().all(|x| x.is_finite()),
    };
    let layer = block.name().starts_with("block.");
    for spec in block.specs() {
        let n: usize = spec.shape.iter().product();
        let g = &grads[spec.offset..spec.offset + n];
        let width = *spec.shape.last().unwrap_or(&1);
        let rows = n / width.max(1);
        match (layer, slot_split(&spec.name)) {
            (true, SlotSplit::Columns { parts }) => {
                let cw = width / parts / per_rank;
                for p in 0..parts {
                    for j in 0..per_rank {
                        let start = p * width / parts + j * cw;
                        out.split
                            .push(squares(g, width, 0..rows, start..start + cw));
                    }
                }
            }
            (true, SlotSplit::Rows) => {
                let rw = rows / per_rank;
                for j in 0..per_rank {
                    out.split
                        .push(squares(g, width, j * rw..(j + 1) * rw, 0..width));
                }
            }
            _ => out.whole.push(squares(g, width, 0..rows, 0..width)),
        }
    }
    Ok(out)
}

impl Trainer {
    /// The gradient's squared norm and finiteness over the whole split model (see the module
    /// header): every rank gets bitwise the same figures, and so does every group size.
    pub(super) fn tensor_parallel_stats(
        &mut self,
        group: &Arc<TensorParallelGroup>,
    ) -> Result<GradStats, TrainError> {
        let (world, chunks) = (group.world(), self.config.tensor_parallel_chunks());
        let per_rank = chunks / world;
        if self.dry {
            let split: usize = self
                .model
                .blocks()
                .iter()
                .flat_map(|b| {
                    b.specs()
                        .iter()
                        .map(move |s| (b.name().starts_with("block."), s))
                })
                .map(|(layer, s)| match (layer, slot_split(&s.name)) {
                    (true, SlotSplit::Columns { parts }) => parts * per_rank,
                    (true, SlotSplit::Rows) => per_rank,
                    _ => 0,
                })
                .sum();
            group.with_comm(|c| c.without_data(Collective::AllGather, 4 * split + 1))?;
            return Ok(GradStats {
                sum_squares: 0.0,
                all_finite: true,
            });
        }
        let blocks = self
            .model
            .blocks()
            .iter()
            .map(|b| block_squares(b, per_rank))
            .collect::<Result<Vec<_>, _>>()?;
        let mine: Vec<f32> = blocks
            .iter()
            .flat_map(|b| b.split.iter().flat_map(|&v| encode(v)))
            .chain([f32::from(u8::from(blocks.iter().all(|b| b.all_finite)))])
            .collect();
        let len = mine.len();
        let all = group.all_gather(&mine).map_err(|e| {
            TrainError::Engine(headroom_tensor::TensorError::invalid(
                "tensor parallelism",
                e,
            ))
        })?;
        let ranks: Vec<&[f32]> = all.chunks_exact(len).collect();
        // Walk the model in the unsplit layout's order: whole slots from here, each split
        // slot's chunks from their ranks (rank r holds chunks r·per_rank … of every part).
        let mut cursor = vec![0usize; world];
        let mut sum_squares = 0.0f64;
        for (b, block) in blocks.iter().zip(self.model.blocks()) {
            let layer = block.name().starts_with("block.");
            let mut whole = b.whole.iter();
            for spec in block.specs() {
                let parts = match (layer, slot_split(&spec.name)) {
                    (true, SlotSplit::Columns { parts }) => parts,
                    (true, SlotSplit::Rows) => 1,
                    _ => {
                        sum_squares += whole.next().copied().unwrap_or(0.0);
                        continue;
                    }
                };
                for _ in 0..parts {
                    for j in 0..chunks {
                        let r = j / per_rank;
                        sum_squares += decode(&ranks[r][4 * cursor[r]..4 * cursor[r] + 4]);
                        cursor[r] += 1;
                    }
                }
            }
        }
        Ok(GradStats {
            sum_squares,
            all_finite: ranks.iter().all(|r| r[len - 1] == 1.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_f64_crosses_as_four_exact_pieces() {
        for v in [0.0, 1.0 / 3.0, 1e-300, 6.02e23, f64::MAX] {
            assert_eq!(decode(&encode(v)).to_bits(), v.to_bits());
        }
    }
}
