//! The order training windows are visited in, as a sampler gives it: sequential, shuffled per
//! epoch from the seed (Fisher–Yates), and the distributed shard of one rank. Positions count
//! windows from the start of training (the *stream index*: epoch × windows per epoch + cursor),
//! so a window is a function of (seed, stream index) alone and any worker can compute it.
//!
//! Not for: reading tokens (see `dataset`) or the position a run resumes from (see `sampler`).

use headroom_memory::synthetic::SplitMix64;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// How windows are ordered within an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SamplerKind {
    /// Windows in file order, every epoch (PyTorch's `SequentialSampler`).
    Sequential,
    /// A permutation per epoch from (seed, epoch) (`RandomSampler` with a seeded generator).
    #[default]
    Shuffled,
}

impl std::str::FromStr for SamplerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<SamplerKind, String> {
        match s {
            "sequential" => Ok(SamplerKind::Sequential),
            "shuffled" => Ok(SamplerKind::Shuffled),
            _ => Err(format!(
                "unknown sampler {s:?}; accepted: sequential, shuffled"
            )),
        }
    }
}

impl std::fmt::Display for SamplerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SamplerKind::Sequential => "sequential",
            SamplerKind::Shuffled => "shuffled",
        })
    }
}

/// The window order of every epoch, computed on demand and shared by the sampler and the
/// loader's workers; the two most recent epochs are kept.
#[derive(Debug)]
pub struct EpochOrders {
    kind: SamplerKind,
    windows: usize,
    seed: u64,
    recent: Mutex<Vec<(u64, Arc<Vec<u32>>)>>,
}

impl EpochOrders {
    pub fn new(kind: SamplerKind, windows: usize, seed: u64) -> EpochOrders {
        EpochOrders {
            kind,
            windows,
            seed,
            recent: Mutex::new(Vec::new()),
        }
    }

    pub fn windows_per_epoch(&self) -> usize {
        self.windows
    }

    /// The order of `epoch`'s windows.
    pub fn epoch(&self, epoch: u64) -> Arc<Vec<u32>> {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, order)) = recent.iter().find(|(e, _)| *e == epoch) {
            return order.clone();
        }
        let order = Arc::new(self.compute(epoch));
        if recent.len() == 2 {
            recent.remove(0);
        }
        recent.push((epoch, order.clone()));
        order
    }

    /// The window at `stream` (windows counted from the start of training).
    pub fn window_at(&self, stream: u64) -> usize {
        let n = self.windows as u64;
        self.epoch(stream / n)[(stream % n) as usize] as usize
    }

    /// Bytes of the orders kept (4 per window per epoch kept).
    pub fn bytes(&self) -> u64 {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.iter().map(|(_, o)| 4 * o.len() as u64).sum()
    }

    /// Fisher–Yates over the window indices, seeded by (seed, epoch).
    fn compute(&self, epoch: u64) -> Vec<u32> {
        let n = self.windows;
        let mut order: Vec<u32> = (0..n as u32).collect();
        if self.kind == SamplerKind::Shuffled {
            let mut rng = SplitMix64::new(self.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for i in (1..n).rev() {
                let j = rng.range(0, i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        order
    }
}

/// One rank's disjoint share of the training stream: chunks of `chunk` consecutive stream
/// positions dealt to the ranks in turn (rank r takes chunks r, r + world, …). With `chunk` =
/// micro-batch × accumulation this is exactly what a data-parallel rank trains on when it skips
/// the other ranks' samples of each global batch (PyTorch's `DistributedSampler` deals single
/// indices; dealing chunks keeps a rank's accumulation steps contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DistributedSampler {
    pub rank: usize,
    pub world: usize,
    pub chunk: usize,
}

impl DistributedSampler {
    /// The whole stream (one rank).
    pub fn single() -> DistributedSampler {
        DistributedSampler {
            rank: 0,
            world: 1,
            chunk: 1,
        }
    }

    /// The stream position of this rank's `local`-th sample.
    pub fn global(&self, local: u64) -> u64 {
        let (c, w, r) = (self.chunk as u64, self.world as u64, self.rank as u64);
        (local / c) * c * w + r * c + local % c
    }

    /// This rank's index of stream position `global`, if the position is in its shard.
    pub fn local(&self, global: u64) -> Option<u64> {
        let (c, w, r) = (self.chunk as u64, self.world as u64, self.rank as u64);
        let round = global / (c * w);
        let within = global % (c * w);
        (within / c == r).then_some(round * c + within % c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_epoch_is_a_permutation_and_sequential_is_the_identity() {
        let shuffled = EpochOrders::new(SamplerKind::Shuffled, 50, 7);
        for epoch in 0..3 {
            let mut o = shuffled.epoch(epoch).to_vec();
            o.sort();
            assert_eq!(o, (0..50).collect::<Vec<u32>>());
        }
        assert_ne!(shuffled.epoch(0), shuffled.epoch(1));
        let sequential = EpochOrders::new(SamplerKind::Sequential, 50, 7);
        // Stream position 123 is epoch 2, cursor 23: window 23 in file order.
        assert_eq!(sequential.window_at(123), 23);
        assert_eq!(
            shuffled.window_at(123),
            shuffled.epoch(2)[23] as usize,
            "the stream index is epoch × 50 + cursor"
        );
        assert_eq!(shuffled.bytes(), 2 * 50 * 4, "two epochs kept");
    }

    #[test]
    fn distributed_shards_are_disjoint_and_cover_the_stream() {
        for (world, chunk) in [(1, 1), (2, 3), (3, 4), (4, 1)] {
            let mut seen = vec![0u32; 240];
            for rank in 0..world {
                let s = DistributedSampler { rank, world, chunk };
                for local in 0..(240 / world) as u64 {
                    let g = s.global(local);
                    seen[g as usize] += 1;
                    assert_eq!(s.local(g), Some(local));
                    // No other rank claims it.
                    for other in (0..world).filter(|&o| o != rank) {
                        let o = DistributedSampler {
                            rank: other,
                            world,
                            chunk,
                        };
                        assert_eq!(o.local(g), None);
                    }
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "world {world} chunk {chunk}");
        }
        // Rank 1 of 2 with chunks of 3 takes positions 3, 4, 5, then 9, 10, 11.
        let s = DistributedSampler {
            rank: 1,
            world: 2,
            chunk: 3,
        };
        let got: Vec<u64> = (0..6).map(|l| s.global(l)).collect();
        assert_eq!(got, [3, 4, 5, 9, 10, 11]);
    }

    #[test]
    fn sampler_names_parse_and_print() {
        for kind in [SamplerKind::Sequential, SamplerKind::Shuffled] {
            assert_eq!(kind.to_string().parse::<SamplerKind>().unwrap(), kind);
        }
        let e = "random".parse::<SamplerKind>().unwrap_err();
        assert!(e.contains("sequential, shuffled"), "{e}");
    }
}
