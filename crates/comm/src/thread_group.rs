//! `ThreadGroup`: N ranks as threads of one process, meeting on a shared board. For each
//! collective every rank posts its contribution; when all have posted, each computes its own
//! result from the contributions in rank order (so every rank gets bitwise the same sums), and
//! the board is cleared once every rank has read it. Waits have a deadline; a rank that fails,
//! panics or leaves the group ends the others' waits at once with an error naming it.
//!
//! Not for: other processes or machines (MPI), or GPUs (NCCL).

use crate::communicator::{Collective, CollectiveCounts, CommError, Communicator};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One rank's contribution to the collective being assembled.
#[derive(Debug)]
struct Post {
    kind: Collective,
    /// The length every rank must agree on (the input's, or the buffer's for broadcast).
    len: usize,
    root: usize,
    data: Arc<Vec<f32>>,
}

#[derive(Debug, Default)]
struct Board {
    /// The collective being assembled (every rank's sequence number for it).
    round: u64,
    posts: Vec<Option<Post>>,
    /// Ranks that have read this round's result.
    taken: Vec<bool>,
    /// A rank that failed, and why.
    failed: Option<(usize, String)>,
    /// Ranks that dropped their handle.
    departed: Vec<bool>,
}

#[derive(Debug)]
struct Shared {
    size: usize,
    deadline: Duration,
    board: Mutex<Board>,
    changed: Condvar,
}

/// Builds the ranks of an in-process group.
#[derive(Debug)]
pub struct ThreadGroup;

impl ThreadGroup {
    /// `size` ranks whose every wait gives up after `deadline`.
    pub fn ranks(size: usize, deadline: Duration) -> Vec<ThreadRank> {
        let shared = Arc::new(Shared {
            size,
            deadline,
            board: Mutex::new(Board {
                posts: (0..size).map(|_| None).collect(),
                taken: vec![false; size],
                departed: vec![false; size],
                ..Board::default()
            }),
            changed: Condvar::new(),
        });
        (0..size)
            .map(|rank| ThreadRank {
                rank,
                shared: Arc::clone(&shared),
                sequence: 0,
                counts: CollectiveCounts::default(),
                began: None,
            })
            .collect()
    }

    /// Runs `f` on every rank, each on its own thread, and returns their results in rank order.
    pub fn run<T: Send>(
        size: usize,
        deadline: Duration,
        f: impl Fn(ThreadRank) -> T + Sync,
    ) -> Vec<std::thread::Result<T>> {
        let ranks = ThreadGroup::ranks(size, deadline);
        std::thread::scope(|scope| {
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|r| {
                    let f = &f;
                    scope.spawn(move || f(r))
                })
                .collect();
            handles.into_iter().map(|h| h.join()).collect()
        })
    }
}

/// One rank of a `ThreadGroup`.
#[derive(Debug)]
pub struct ThreadRank {
    rank: usize,
    shared: Arc<Shared>,
    /// Collectives this rank has joined.
    sequence: u64,
    counts: CollectiveCounts,
    /// When the collective in progress began (set by `exchange`, taken by `settle`).
    began: Option<Instant>,
}

impl ThreadRank {
    /// Adds the collective that just ended to the time spent inside collectives.
    fn settle(&mut self) {
        if let Some(t) = self.began.take() {
            self.counts.add_busy(t);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Board> {
        // A rank that panicked while holding the lock cannot leave the board half-updated: no
        // code below panics between reading and writing it.
        self.shared
            .board
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until `ready` holds, failing on a failed or departed peer, or at the deadline.
    fn wait_until<'a>(
        &self,
        mut board: MutexGuard<'a, Board>,
        kind: Collective,
        until: Instant,
        ready: impl Fn(&Board) -> bool,
        missing: impl Fn(&Board) -> Vec<usize>,
    ) -> Result<MutexGuard<'a, Board>, CommError> {
        loop {
            if let Some((failed, reason)) = &board.failed {
                return Err(CommError::PeerFailed {
                    rank: self.rank,
                    collective: kind,
                    sequence: self.sequence,
                    failed: *failed,
                    reason: reason.clone(),
                });
            }
            if ready(&board) {
                return Ok(board);
            }
            let absent = missing(&board);
            if let Some(&gone) = absent.iter().find(|&&r| board.departed[r]) {
                return Err(CommError::PeerFailed {
                    rank: self.rank,
                    collective: kind,
                    sequence: self.sequence,
                    failed: gone,
                    reason: "it left the group without joining this collective".into(),
                });
            }
            let now = Instant::now();
            if now >= until {
                board.failed = Some((
                    self.rank,
                    format!("its {kind} #{} timed out", self.sequence),
                ));
                self.shared.changed.notify_all();
                return Err(CommError::Timeout {
                    rank: self.rank,
                    collective: kind,
                    sequence: self.sequence,
                    after: self.shared.deadline,
                    missing: absent,
                });
            }
            board = self
                .shared
                .changed
                .wait_timeout(board, until - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    /// Posts this rank's contribution, waits for every rank's, checks they agree, and returns
    /// them in rank order.
    fn exchange(
        &mut self,
        kind: Collective,
        len: usize,
        root: usize,
        data: Vec<f32>,
    ) -> Result<Vec<Arc<Vec<f32>>>, CommError> {
        let began = Instant::now();
        self.began = Some(began);
        let until = began + self.shared.deadline;
        let seq = self.sequence;
        let board = self.lock();
        // The previous collective must have been read by every rank before its slots are reused.
        let mut board = self.wait_until(
            board,
            kind,
            until,
            |b| b.round == seq,
            |b| (0..b.taken.len()).filter(|&r| !b.taken[r]).collect(),
        )?;
        board.posts[self.rank] = Some(Post {
            kind,
            len,
            root,
            data: Arc::new(data),
        });
        self.shared.changed.notify_all();
        let mut board = self.wait_until(
            board,
            kind,
            until,
            |b| b.posts.iter().all(Option::is_some),
            |b| {
                (0..b.posts.len())
                    .filter(|&r| b.posts[r].is_none())
                    .collect()
            },
        )?;
        let posts: Vec<&Post> = board.posts.iter().flatten().collect();
        let mismatch = mismatch(self.rank, seq, &posts);
        let contributions = posts.iter().map(|p| Arc::clone(&p.data)).collect();
        board.taken[self.rank] = true;
        if board.taken.iter().all(|&t| t) {
            board.posts.iter_mut().for_each(|p| *p = None);
            board.taken.iter_mut().for_each(|t| *t = false);
            board.round += 1;
        }
        self.shared.changed.notify_all();
        drop(board);
        self.sequence += 1;
        self.counts.record(kind, len);
        match mismatch {
            Some(e) => Err(e),
            None => Ok(contributions),
        }
    }

    fn bad(&self, kind: Collective, reason: String) -> CommError {
        CommError::BadArguments {
            rank: self.rank,
            collective: kind,
            reason,
        }
    }
}

/// The first disagreement between this rank's post and another's.
fn mismatch(rank: usize, sequence: u64, posts: &[&Post]) -> Option<CommError> {
    let ours = posts[rank];
    posts
        .iter()
        .enumerate()
        .find(|(_, p)| p.kind != ours.kind || p.len != ours.len || p.root != ours.root)
        .map(|(other, p)| CommError::Mismatch {
            rank,
            sequence,
            ours: ours.kind,
            our_len: ours.len,
            other,
            theirs: p.kind,
            their_len: p.len,
        })
}

/// `sum[i] = parts[0][range][i] + parts[1][range][i] + …`, in rank order.
fn sum_in_rank_order(parts: &[Arc<Vec<f32>>], range: std::ops::Range<usize>, out: &mut [f32]) {
    out.copy_from_slice(&parts[0][range.clone()]);
    for part in &parts[1..] {
        for (o, x) in out.iter_mut().zip(&part[range.clone()]) {
            *o += *x;
        }
    }
}

impl Communicator for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CommError> {
        let parts = self.exchange(Collective::AllReduce, data.len(), 0, data.to_vec())?;
        sum_in_rank_order(&parts, 0..data.len(), data);
        self.settle();
        Ok(())
    }

    fn reduce_scatter_sum(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError> {
        let kind = Collective::ReduceScatter;
        if input.len() != output.len() * self.shared.size {
            return Err(self.bad(
                kind,
                format!(
                    "an input of {} elements for {} ranks of {} (it must be world size × output)",
                    input.len(),
                    self.shared.size,
                    output.len()
                ),
            ));
        }
        let parts = self.exchange(kind, input.len(), 0, input.to_vec())?;
        let chunk = output.len();
        let start = self.rank * chunk;
        sum_in_rank_order(&parts, start..start + chunk, output);
        self.settle();
        Ok(())
    }

    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError> {
        let kind = Collective::AllGather;
        if output.len() != input.len() * self.shared.size {
            return Err(self.bad(
                kind,
                format!(
                    "an output of {} elements for {} ranks of {} (it must be world size × input)",
                    output.len(),
                    self.shared.size,
                    input.len()
                ),
            ));
        }
        let parts = self.exchange(kind, input.len(), 0, input.to_vec())?;
        for (chunk, part) in output.chunks_mut(input.len().max(1)).zip(&parts) {
            chunk.copy_from_slice(part);
        }
        self.settle();
        Ok(())
    }

    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CommError> {
        let kind = Collective::Broadcast;
        if root >= self.shared.size {
            return Err(self.bad(kind, format!("root {root} of {} ranks", self.shared.size)));
        }
        let contribution = if self.rank == root {
            data.to_vec()
        } else {
            Vec::new()
        };
        let parts = self.exchange(kind, data.len(), root, contribution)?;
        data.copy_from_slice(&parts[root]);
        self.settle();
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.exchange(Collective::Barrier, 0, 0, Vec::new())?;
        self.settle();
        Ok(())
    }

    fn fail(&mut self, reason: &str) {
        let mut board = self.lock();
        board.failed.get_or_insert((self.rank, reason.to_string()));
        self.shared.changed.notify_all();
    }

    fn counts(&self) -> CollectiveCounts {
        self.counts
    }
}

impl Drop for ThreadRank {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.fail("it panicked");
        }
        let mut board = self.lock();
        board.departed[self.rank] = true;
        self.shared.changed.notify_all();
    }
}
