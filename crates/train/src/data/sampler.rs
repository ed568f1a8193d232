//! Deterministic batches: the token stream is split into a training part and a validation tail;
//! the training part is cut into windows of `seq_len + 1` tokens (stride `seq_len`), visited in
//! an order shuffled per epoch from the seed (or in file order), so the same seed gives the same
//! batches and a checkpoint's `DataPosition` resumes exactly where it stopped.
//!
//! Not for: moving batches to the device (the trainer copies them into `input` tensors) or
//! drawing them ahead on worker threads (see `loader`, which shares this sampler's windows and
//! orders).

use super::corpus::{Corpus, CorpusError};
use super::dataset::{IterableDataset, MapDataset, Tokens, Windows, collate};
use super::order::{EpochOrders, SamplerKind};
use super::token_file::TokenFileError;
use super::tokenizer::ByteTokenizer;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Which part of the corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Validation,
}

/// One micro-batch of token ids: `inputs` and `targets` are (batch, seq_len), row-major;
/// `targets` are `inputs` shifted by one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    pub batch: usize,
    pub seq_len: usize,
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
}

/// Where the training stream stands: resumable from a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DataPosition {
    pub epoch: u64,
    /// Windows already consumed in this epoch.
    pub cursor: u64,
}

/// The sampler over one tokenized corpus.
#[derive(Debug, Clone)]
pub struct TokenSampler {
    train: Arc<Windows>,
    validation: Windows,
    seq_len: usize,
    orders: Arc<EpochOrders>,
    order: Arc<Vec<u32>>,
    position: DataPosition,
}

impl TokenSampler {
    /// Tokenizes `corpus` and keeps the last `validation_fraction` of it for validation.
    pub fn new(
        corpus: &Corpus,
        seq_len: usize,
        validation_fraction: f64,
        seed: u64,
    ) -> Result<TokenSampler, CorpusError> {
        let tokens = Tokens::Owned(ByteTokenizer.encode(&corpus.bytes));
        TokenSampler::over(
            tokens,
            seq_len,
            validation_fraction,
            seed,
            SamplerKind::Shuffled,
        )
        .map_err(|needed| CorpusError::TooSmall {
            name: corpus.name.clone(),
            bytes: corpus.len(),
            needed,
        })
    }

    /// A sampler over `tokens` (a text tokenized in memory or a mapped token file); the error
    /// is the number of tokens needed when there are too few.
    pub fn over(
        tokens: Tokens,
        seq_len: usize,
        validation_fraction: f64,
        seed: u64,
        kind: SamplerKind,
    ) -> Result<TokenSampler, usize> {
        let len = tokens.len();
        let val_len = ((len as f64) * validation_fraction.clamp(0.0, 0.5)) as usize;
        let train_len = len - val_len;
        // At least two training windows and one validation window.
        let needed = 2 * seq_len + 1;
        if seq_len == 0 || train_len < needed || val_len < seq_len + 1 {
            return Err(needed + seq_len + 1);
        }
        let tokens = Arc::new(tokens);
        let train = Arc::new(Windows::within(tokens.clone(), 0..train_len, seq_len));
        let validation = Windows::within(tokens, train_len..len, seq_len);
        let orders = Arc::new(EpochOrders::new(kind, train.len(), seed));
        Ok(TokenSampler {
            order: orders.epoch(0),
            train,
            validation,
            seq_len,
            orders,
            position: DataPosition::default(),
        })
    }

    /// Number of training windows per epoch.
    pub fn windows_per_epoch(&self) -> usize {
        self.train.len()
    }

    pub fn position(&self) -> DataPosition {
        self.position
    }

    /// Windows consumed since the start of training: epoch × windows per epoch + cursor.
    pub fn stream_index(&self) -> u64 {
        self.position.epoch * self.windows_per_epoch() as u64 + self.position.cursor
    }

    /// The training windows and their orders, which the loader's workers share.
    pub fn shared(&self) -> (Arc<Windows>, Arc<EpochOrders>) {
        (self.train.clone(), self.orders.clone())
    }

    /// Continues from a checkpoint's position.
    pub fn seek(&mut self, position: DataPosition) {
        self.position = DataPosition {
            epoch: position.epoch,
            cursor: 0,
        };
        self.shuffle_epoch();
        self.position.cursor = position.cursor.min(self.order.len() as u64);
    }

    /// The order of the current epoch's windows.
    fn shuffle_epoch(&mut self) {
        self.order = self.orders.epoch(self.position.epoch);
    }

    /// The next training micro-batch of `batch` sequences; epochs roll over.
    ///
    /// # Panics
    /// When a prepared token file holds a token outside its vocabulary (it was changed after
    /// it was checked); [`Self::try_next_train`] returns that as an error.
    pub fn next_train(&mut self, batch: usize) -> TokenBatch {
        self.try_next_train(batch).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The next training micro-batch of `batch` sequences; epochs roll over.
    pub fn try_next_train(&mut self, batch: usize) -> Result<TokenBatch, TokenFileError> {
        let windows = self.next_windows(batch);
        let mut out = TokenBatch {
            batch,
            seq_len: self.seq_len,
            inputs: vec![0; batch * self.seq_len],
            targets: vec![0; batch * self.seq_len],
        };
        let mut scratch = vec![0; self.seq_len + 1];
        collate(
            self.train.as_ref(),
            windows.into_iter(),
            &mut out.inputs,
            &mut out.targets,
            &mut scratch,
        )?;
        Ok(out)
    }

    /// The windows of the next `batch` sequences, moving past them.
    pub(crate) fn next_windows(&mut self, batch: usize) -> Vec<usize> {
        (0..batch).map(|_| self.next_window()).collect()
    }

    /// Moves past `batch` training sequences exactly as [`Self::next_train`] would, without
    /// copying them (a dry run needs the position, not the tokens).
    pub fn skip_train(&mut self, batch: usize) {
        for _ in 0..batch {
            self.next_window();
        }
    }

    /// The next window of the shuffled order, starting a new epoch when one is used up.
    fn next_window(&mut self) -> usize {
        if self.position.cursor as usize >= self.order.len() {
            self.position = DataPosition {
                epoch: self.position.epoch + 1,
                cursor: 0,
            };
            self.shuffle_epoch();
        }
        let w = self.order[self.position.cursor as usize] as usize;
        self.position.cursor += 1;
        w
    }

    /// Validation batches in order (the same every time): up to `max_batches` of `batch` rows.
    ///
    /// # Panics
    /// As [`Self::next_train`]; [`Self::try_validation_batches`] returns the error.
    pub fn validation_batches(&self, batch: usize, max_batches: usize) -> Vec<TokenBatch> {
        self.try_validation_batches(batch, max_batches)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Validation batches in order, read from the held-out tail as a stream.
    pub fn try_validation_batches(
        &self,
        batch: usize,
        max_batches: usize,
    ) -> Result<Vec<TokenBatch>, TokenFileError> {
        let full = (self.validation.len() / batch.max(1)).min(max_batches);
        let mut windows = self.validation.iter_shard(0, 1);
        let mut out = Vec::with_capacity(full);
        for _ in 0..full {
            let mut b = TokenBatch {
                batch,
                seq_len: self.seq_len,
                inputs: Vec::with_capacity(batch * self.seq_len),
                targets: Vec::with_capacity(batch * self.seq_len),
            };
            for w in windows.by_ref().take(batch) {
                let w = w?;
                b.inputs.extend_from_slice(&w[..self.seq_len]);
                b.targets.extend_from_slice(&w[1..]);
            }
            out.push(b);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn corpus(n: usize) -> Corpus {
        Corpus {
            name: "test".into(),
            bytes: Cow::Owned((0..n).map(|i| (i % 251) as u8).collect()),
        }
    }

    #[test]
    fn targets_are_inputs_shifted_by_one() {
        let mut s = TokenSampler::new(&corpus(1000), 8, 0.1, 1).unwrap();
        let b = s.next_train(4);
        assert_eq!(b.inputs.len(), 32);
        for row in 0..4 {
            for t in 0..7 {
                assert_eq!(b.targets[row * 8 + t], b.inputs[row * 8 + t + 1]);
            }
            // The corpus is i mod 251, so each target is its input + 1 (mod 251).
            assert_eq!(b.targets[row * 8 + 7], (b.inputs[row * 8 + 7] + 1) % 251);
        }
    }

    #[test]
    fn an_epoch_visits_every_window_once_and_seeds_decide_the_order() {
        let mut s = TokenSampler::new(&corpus(1000), 10, 0.1, 7).unwrap();
        // 900 training tokens → (900 − 1) / 10 = 89 windows.
        assert_eq!(s.windows_per_epoch(), 89);
        let firsts: Vec<u32> = (0..89).map(|_| s.next_train(1).inputs[0]).collect();
        let mut starts: Vec<u32> = firsts.clone();
        starts.sort();
        starts.dedup();
        // Window k starts with token (10k) mod 251, distinct for k < 251 (gcd(10, 251) = 1).
        assert_eq!(starts.len(), 89, "every window once");
        let mut other = TokenSampler::new(&corpus(1000), 10, 0.1, 8).unwrap();
        let other_firsts: Vec<u32> = (0..89).map(|_| other.next_train(1).inputs[0]).collect();
        assert_ne!(firsts, other_firsts);
        assert_eq!(
            s.position(),
            DataPosition {
                epoch: 0,
                cursor: 89
            }
        );
        s.next_train(1);
        assert_eq!(
            s.position(),
            DataPosition {
                epoch: 1,
                cursor: 1
            }
        );
    }

    #[test]
    fn seek_resumes_the_same_stream() {
        let mut a = TokenSampler::new(&corpus(5000), 16, 0.1, 3).unwrap();
        for _ in 0..40 {
            a.next_train(3);
        }
        let pos = a.position();
        let expected: Vec<TokenBatch> = (0..50).map(|_| a.next_train(3)).collect();
        // Skipping moves exactly as sampling does, across epoch boundaries too.
        let mut skipped = TokenSampler::new(&corpus(1000), 10, 0.1, 9).unwrap();
        let mut sampled = TokenSampler::new(&corpus(1000), 10, 0.1, 9).unwrap();
        for _ in 0..40 {
            skipped.skip_train(7);
            sampled.next_train(7);
            assert_eq!(skipped.position(), sampled.position());
        }
        assert_eq!(skipped.next_train(2), sampled.next_train(2));
        let mut b = TokenSampler::new(&corpus(5000), 16, 0.1, 3).unwrap();
        b.seek(pos);
        let got: Vec<TokenBatch> = (0..50).map(|_| b.next_train(3)).collect();
        assert_eq!(expected, got);
    }

    #[test]
    fn validation_comes_from_the_held_out_tail() {
        let s = TokenSampler::new(&corpus(1000), 10, 0.1, 1).unwrap();
        let v = s.validation_batches(2, 100);
        // Tail = tokens 900..1000: windows start at 900, 910, …, 980 (start + 11 ≤ 1000) → 9
        // windows → 4 full batches of 2.
        assert_eq!(v.len(), 4);
        assert_eq!(v[0].inputs[0], (900 % 251) as u32);
    }

    #[test]
    fn too_small_corpus_is_a_clear_error() {
        let e = TokenSampler::new(&corpus(50), 64, 0.1, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--seq-len"), "{e}");
    }
}
