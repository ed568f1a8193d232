//! The `Communicator` trait: one rank's view of a group, and the collectives it can join.
//!
//! Not for: a transport (see `thread_group`).

use serde::Serialize;
use std::time::Duration;

/// A collective operation, as errors and counters name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Barrier,
}

impl std::fmt::Display for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::Broadcast => "broadcast",
            Collective::Barrier => "barrier",
        })
    }
}

impl Collective {
    /// Elements one rank sends in this collective of `elements` (as counted: the data of an
    /// all-reduce or broadcast, the input of a reduce-scatter or all-gather) among `world`
    /// ranks when it runs as a ring, the bandwidth-optimal schedule (Patarasuk & Yuan 2009):
    /// an all-reduce 2(N−1)/N·n, a reduce-scatter (N−1)/N·n, an all-gather (N−1)·n, a
    /// pipelined broadcast about n, a barrier nothing.
    pub fn ring_elements(self, elements: u64, world: usize) -> f64 {
        let n = world.max(1) as f64;
        let e = elements as f64;
        match self {
            _ if world <= 1 => 0.0,
            Collective::AllReduce => 2.0 * (n - 1.0) / n * e,
            Collective::ReduceScatter => (n - 1.0) / n * e,
            Collective::AllGather => (n - 1.0) * e,
            Collective::Broadcast => e,
            Collective::Barrier => 0.0,
        }
    }
}

/// Why a collective failed; every variant names the rank that saw it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    #[error(
        "rank {rank}: {collective} #{sequence} timed out after {after:?} waiting for rank(s) {missing:?}; a rank is stuck or dead"
    )]
    Timeout {
        rank: usize,
        collective: Collective,
        sequence: u64,
        after: Duration,
        missing: Vec<usize>,
    },
    #[error(
        "rank {rank}: collective #{sequence} mismatched: this rank called {ours} of {our_len} elements, rank {other} called {theirs} of {their_len}; every rank must call the same collectives in the same order"
    )]
    Mismatch {
        rank: usize,
        sequence: u64,
        ours: Collective,
        our_len: usize,
        other: usize,
        theirs: Collective,
        their_len: usize,
    },
    #[error("rank {rank}: {collective} #{sequence} abandoned: rank {failed} failed ({reason})")]
    PeerFailed {
        rank: usize,
        collective: Collective,
        sequence: u64,
        failed: usize,
        reason: String,
    },
    #[error("rank {rank}: {collective} with {reason}")]
    BadArguments {
        rank: usize,
        collective: Collective,
        reason: String,
    },
}

/// Collectives a rank joined and the elements it contributed, per kind (calls, elements), and
/// the wall time it spent inside them, waiting for the others included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CollectiveCounts {
    pub all_reduce: (u64, u64),
    pub reduce_scatter: (u64, u64),
    pub all_gather: (u64, u64),
    pub broadcast: (u64, u64),
    pub barrier: (u64, u64),
    /// Nanoseconds inside collectives (0 on a shape-only rank, which moves nothing).
    pub busy_ns: u64,
}

impl CollectiveCounts {
    /// Adds one collective of `elements`.
    pub fn record(&mut self, c: Collective, elements: usize) {
        let slot = match c {
            Collective::AllReduce => &mut self.all_reduce,
            Collective::ReduceScatter => &mut self.reduce_scatter,
            Collective::AllGather => &mut self.all_gather,
            Collective::Broadcast => &mut self.broadcast,
            Collective::Barrier => &mut self.barrier,
        };
        slot.0 += 1;
        slot.1 += elements as u64;
    }

    /// Adds the time since `started` to the time spent inside collectives.
    pub fn add_busy(&mut self, started: std::time::Instant) {
        self.busy_ns += started.elapsed().as_nanos() as u64;
    }

    /// Seconds spent inside collectives.
    pub fn busy_s(&self) -> f64 {
        self.busy_ns as f64 * 1e-9
    }

    /// Calls over every collective.
    pub fn calls(&self) -> u64 {
        self.all_reduce.0
            + self.reduce_scatter.0
            + self.all_gather.0
            + self.broadcast.0
            + self.barrier.0
    }

    /// The counts since `earlier` (a snapshot of the same rank's counts).
    pub fn since(&self, earlier: &CollectiveCounts) -> CollectiveCounts {
        let d = |a: (u64, u64), b: (u64, u64)| (a.0 - b.0, a.1 - b.1);
        CollectiveCounts {
            all_reduce: d(self.all_reduce, earlier.all_reduce),
            reduce_scatter: d(self.reduce_scatter, earlier.reduce_scatter),
            all_gather: d(self.all_gather, earlier.all_gather),
            broadcast: d(self.broadcast, earlier.broadcast),
            barrier: d(self.barrier, earlier.barrier),
            busy_ns: self.busy_ns - earlier.busy_ns,
        }
    }

    /// Elements this rank sends over the network in a group of `world` ranks if every
    /// collective runs as a ring (see [`Collective::ring_elements`]).
    pub fn ring_elements(&self, world: usize) -> f64 {
        [
            (Collective::AllReduce, self.all_reduce.1),
            (Collective::ReduceScatter, self.reduce_scatter.1),
            (Collective::AllGather, self.all_gather.1),
            (Collective::Broadcast, self.broadcast.1),
        ]
        .iter()
        .map(|&(kind, elements)| kind.ring_elements(elements, world))
        .sum()
    }

    /// Elements contributed over every collective.
    pub fn elements(&self) -> u64 {
        self.all_reduce.1
            + self.reduce_scatter.1
            + self.all_gather.1
            + self.broadcast.1
            + self.barrier.1
    }
}

/// One rank of a communication group. Every rank must call the same collectives, with the
/// same lengths, in the same order.
pub trait Communicator: Send {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Every rank's `data` becomes the elementwise sum over ranks, summed in rank order.
    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CommError>;
    /// `input` is `world_size` equal chunks; rank r's `output` becomes the sum over ranks of
    /// chunk r, summed in rank order.
    fn reduce_scatter_sum(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError>;
    /// `output` becomes every rank's `input`, in rank order.
    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError>;
    /// Every rank's `data` becomes `root`'s.
    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CommError>;
    /// Returns when every rank has called it.
    fn barrier(&mut self) -> Result<(), CommError>;
    /// Marks this rank failed: the other ranks' current and later collectives end with an
    /// error naming it instead of waiting for their deadline.
    fn fail(&mut self, reason: &str);
    /// What this rank has communicated so far.
    fn counts(&self) -> CollectiveCounts;
    /// A collective of `elements` (counted as the data-moving call would count them) whose
    /// buffers hold no bytes: a dry run on a shape-only device. Only a shape-only rank takes
    /// it; a communicator that moves data refuses it.
    fn without_data(&mut self, kind: Collective, elements: usize) -> Result<(), CommError> {
        Err(CommError::BadArguments {
            rank: self.rank(),
            collective: kind,
            reason: format!(
                "no data for {elements} elements: shape-only buffers reached a communicator that moves data"
            ),
        })
    }
    /// Marks this rank's work complete: dropping a rank that never completed means it failed
    /// (an error returned early), which a transport that would otherwise hang (MPI) turns into
    /// ending the job.
    fn complete(&mut self) {}
}
