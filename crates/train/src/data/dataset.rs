//! Datasets of training windows, in the two shapes PyTorch's `DataLoader` takes:
//!
//! - map-style ([`MapDataset`]): a length and random access by index, so any sampler order and
//!   any number of workers can draw from it; [`Windows`] is the one every run uses;
//! - iterable ([`IterableDataset`]): a stream read front to back, which each consumer shards
//!   by stride (as a PyTorch iterable dataset does with `get_worker_info`); validation reads
//!   its windows this way.
//!
//! A window is `seq_len + 1` tokens (inputs and targets shifted by one), taken with stride
//! `seq_len` from [`Tokens`]: a tokenized text in memory, or a prepared token file
//! memory-mapped. `collate` turns windows into a batch, for the sampler and the loader alike.
//!
//! Not for: the order windows are visited in (see `order`) or workers (see `loader`).

use super::token_file::{TokenFile, TokenFileError};
use std::sync::Arc;

/// The tokens a run reads.
#[derive(Debug)]
pub enum Tokens {
    /// A text tokenized in memory (the bundled corpus, a `--data` text file).
    Owned(Vec<u32>),
    /// A prepared token file, read through its memory map.
    Mapped(TokenFile),
}

impl Tokens {
    pub fn len(&self) -> usize {
        match self {
            Tokens::Owned(t) => t.len(),
            Tokens::Mapped(f) => f.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lets go of the mapped pages read so far (nothing for tokens in memory).
    pub fn release_pages(&self) {
        if let Tokens::Mapped(f) = self {
            f.release_pages();
        }
    }

    /// Tokens `start..start + out.len()`.
    pub fn read(&self, start: usize, out: &mut [u32]) -> Result<(), TokenFileError> {
        match self {
            Tokens::Owned(t) => {
                out.copy_from_slice(&t[start..start + out.len()]);
                Ok(())
            }
            Tokens::Mapped(f) => f.read(start, out),
        }
    }
}

/// Random access to samples of a fixed length.
pub trait MapDataset: Send + Sync + std::fmt::Debug {
    /// Samples in the dataset.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Tokens per sample.
    fn sample_len(&self) -> usize;
    /// Sample `index` into `out` (`sample_len` tokens).
    fn get(&self, index: usize, out: &mut [u32]) -> Result<(), TokenFileError>;
}

/// A stream of samples read in order, of which a consumer takes every `shards`-th from `shard`.
pub trait IterableDataset {
    fn iter_shard(
        &self,
        shard: usize,
        shards: usize,
    ) -> Box<dyn Iterator<Item = Result<Vec<u32>, TokenFileError>> + Send + '_>;
}

/// `count` windows of `seq_len + 1` tokens starting at token `first`, stride `seq_len`.
#[derive(Debug, Clone)]
pub struct Windows {
    tokens: Arc<Tokens>,
    seq_len: usize,
    first: usize,
    count: usize,
}

impl Windows {
    /// The windows whose every token lies in `range` of `tokens`.
    pub fn within(tokens: Arc<Tokens>, range: std::ops::Range<usize>, seq_len: usize) -> Windows {
        let span = range.len();
        let count = if span > seq_len {
            (span - 1) / seq_len
        } else {
            0
        };
        Windows {
            tokens,
            seq_len,
            first: range.start,
            count,
        }
    }

    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    pub fn tokens(&self) -> &Arc<Tokens> {
        &self.tokens
    }
}

impl MapDataset for Windows {
    fn len(&self) -> usize {
        self.count
    }

    fn sample_len(&self) -> usize {
        self.seq_len + 1
    }

    fn get(&self, index: usize, out: &mut [u32]) -> Result<(), TokenFileError> {
        self.tokens.read(self.first + index * self.seq_len, out)
    }
}

impl IterableDataset for Windows {
    fn iter_shard(
        &self,
        shard: usize,
        shards: usize,
    ) -> Box<dyn Iterator<Item = Result<Vec<u32>, TokenFileError>> + Send + '_> {
        Box::new((shard..self.count).step_by(shards.max(1)).map(|i| {
            let mut w = vec![0; self.seq_len + 1];
            self.get(i, &mut w).map(|()| w)
        }))
    }
}

/// Collates samples `indices` of `dataset` into row-major `inputs` and `targets` (targets are
/// inputs shifted by one token), each `indices.len() × (sample_len − 1)`; `scratch` holds one
/// sample.
pub fn collate<T: From<u32>>(
    dataset: &dyn MapDataset,
    indices: impl Iterator<Item = usize>,
    inputs: &mut [T],
    targets: &mut [T],
    scratch: &mut [u32],
) -> Result<(), TokenFileError> {
    let n = dataset.sample_len() - 1;
    for (row, index) in indices.enumerate() {
        dataset.get(index, scratch)?;
        for t in 0..n {
            inputs[row * n + t] = T::from(scratch[t]);
            targets[row * n + t] = T::from(scratch[t + 1]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(n: u32, seq_len: usize) -> Windows {
        let tokens = Arc::new(Tokens::Owned((0..n).collect()));
        Windows::within(tokens, 0..n as usize, seq_len)
    }

    #[test]
    fn windows_overlap_by_one_token_and_stay_in_range() {
        // 0..20 with seq_len 4: windows start at 0, 4, 8, 12 (16 + 5 > 20): (20 − 1) / 4 = 4.
        let w = windows(20, 4);
        assert_eq!(w.len(), 4);
        let mut s = [0; 5];
        w.get(3, &mut s).unwrap();
        assert_eq!(s, [12, 13, 14, 15, 16]);
        let tail = Windows::within(w.tokens().clone(), 15..20, 4);
        assert_eq!(tail.len(), 1);
    }

    #[test]
    fn collated_targets_are_inputs_shifted() {
        let w = windows(40, 3);
        let (mut x, mut y, mut s) = (vec![0i64; 6], vec![0i64; 6], vec![0; 4]);
        collate(&w, [2, 0].into_iter(), &mut x, &mut y, &mut s).unwrap();
        // Window 2 = tokens 6..10, window 0 = tokens 0..4.
        assert_eq!(x, [6, 7, 8, 0, 1, 2]);
        assert_eq!(y, [7, 8, 9, 1, 2, 3]);
    }

    #[test]
    fn iterable_shards_partition_the_stream_in_order() {
        let w = windows(100, 4); // 24 windows
        let all: Vec<Vec<u32>> = w.iter_shard(0, 1).map(Result::unwrap).collect();
        assert_eq!(all.len(), 24);
        let mut merged = Vec::new();
        let shards: Vec<Vec<Vec<u32>>> = (0..3)
            .map(|s| w.iter_shard(s, 3).map(Result::unwrap).collect())
            .collect();
        for i in 0..8 {
            for shard in &shards {
                merged.push(shard[i].clone());
            }
        }
        assert_eq!(merged, all, "round-robin over the shards gives the stream");
    }
}
