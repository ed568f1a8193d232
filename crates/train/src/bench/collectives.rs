//! The bandwidth of headroom's communicators, per collective and size: the in-process thread
//! group at each size asked for, and under `mpirun` (the `mpi` build) the MPI communicator
//! against plain MPI on the same buffers (`MPI_Allreduce`, `MPI_Reduce_scatter_block`,
//! `MPI_Allgather`). Figures follow nccl-tests' conventions (docs/sources.md §14): the algorithm
//! bandwidth is the collective's data size over its time, the bus bandwidth that times 2(N−1)/N
//! for an all-reduce and (N−1)/N for the others, the per-link rate a ring would need.
//!
//! Not for: the speed model's collective rates (measured by `--auto` at the run's world size).

use super::{BenchError, median};
use headroom_comm::{Collective, CommError, Communicator, ThreadGroup};
use serde::Serialize;
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Debug, Clone)]
pub struct CollectivesOptions {
    /// Thread-group sizes (ignored under mpirun, where the job's size is the group).
    pub ranks: Vec<usize>,
    /// Elements (f32) of each collective's data: an all-reduce's buffer, a reduce-scatter's
    /// input, an all-gather's output.
    pub elements: Vec<usize>,
    /// Timed calls per collective and size (after 2 warm-up calls); the median is kept.
    pub reps: usize,
}

/// One collective at one size on one transport.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub transport: String,
    pub ranks: usize,
    pub collective: Collective,
    pub elements: usize,
    /// Median seconds per call, the slowest rank's.
    pub seconds: f64,
    pub algorithm_gb_per_s: f64,
    pub bus_gb_per_s: f64,
}

impl Row {
    fn new(transport: &str, ranks: usize, collective: Collective, elements: usize, s: f64) -> Row {
        let n = ranks as f64;
        let factor = match collective {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            _ => (n - 1.0) / n,
        };
        let algorithm = 4.0 * elements as f64 / s / 1e9;
        Row {
            transport: transport.to_string(),
            ranks,
            collective,
            elements,
            seconds: s,
            algorithm_gb_per_s: algorithm,
            bus_gb_per_s: algorithm * factor,
        }
    }
}

/// What this process measured.
#[derive(Debug, Clone)]
pub enum CollectivesRun {
    /// The rows to report: the thread groups', or under mpirun both MPI transports' on rank 0.
    Rows(Vec<Row>),
    /// Another rank of an mpirun job: rank 0 reports.
    OtherRank,
}

const KINDS: [Collective; 3] = [
    Collective::AllReduce,
    Collective::ReduceScatter,
    Collective::AllGather,
];

/// Measures the thread groups, or under mpirun (the `mpi` build) the job's MPI transports.
pub fn measure(options: &CollectivesOptions) -> Result<CollectivesRun, BenchError> {
    if let Some(run) = mpi::measure(options)? {
        return Ok(run);
    }
    let mut rows = Vec::new();
    for &ranks in &options.ranks {
        if ranks < 2 {
            return Err(BenchError::TooFewRanks(ranks));
        }
        let results = ThreadGroup::run(ranks, Duration::from_secs(120), |mut rank| {
            time_all(options, &mut |kind, n| {
                time_kind(&mut rank, kind, n, options.reps)
            })
        });
        let mut per_rank: Vec<Vec<f64>> = Vec::new();
        for r in results {
            per_rank.push(r.map_err(|_| BenchError::RankPanicked)??);
        }
        rows.extend(to_rows(options, "threads", ranks, &slowest(&per_rank)));
    }
    Ok(CollectivesRun::Rows(rows))
}

/// Median seconds of every (collective, size), in `KINDS` × `elements` order, from `time`.
fn time_all(
    options: &CollectivesOptions,
    time: &mut dyn FnMut(Collective, usize) -> Result<f64, CommError>,
) -> Result<Vec<f64>, CommError> {
    let mut out = Vec::new();
    for kind in KINDS {
        for &n in &options.elements {
            out.push(time(kind, n)?);
        }
    }
    Ok(out)
}

/// The slowest rank's time of each measurement.
fn slowest(per_rank: &[Vec<f64>]) -> Vec<f64> {
    (0..per_rank[0].len())
        .map(|i| per_rank.iter().map(|r| r[i]).fold(0.0, f64::max))
        .collect()
}

fn to_rows(options: &CollectivesOptions, transport: &str, ranks: usize, times: &[f64]) -> Vec<Row> {
    let mut t = times.iter();
    KINDS
        .iter()
        .flat_map(|&kind| options.elements.iter().map(move |&n| (kind, n)))
        .map(|(kind, n)| {
            Row::new(
                transport,
                ranks,
                kind,
                round_to(n, ranks),
                *t.next().expect("one time per collective and size"),
            )
        })
        .collect()
}

/// `n` rounded up to a multiple of `ranks` (equal chunks).
fn round_to(n: usize, ranks: usize) -> usize {
    n.div_ceil(ranks).max(1) * ranks
}

/// Median seconds per call of `kind` on `n` elements through `comm`, every rank in step.
fn time_kind(
    comm: &mut dyn Communicator,
    kind: Collective,
    n: usize,
    reps: usize,
) -> Result<f64, CommError> {
    let world = comm.world_size();
    let n = round_to(n, world);
    let mut whole = vec![0.5f32; n];
    let mut part = vec![0.5f32; n / world];
    let mut times = Vec::with_capacity(reps);
    for i in 0..reps + 2 {
        comm.barrier()?;
        let started = Instant::now();
        match kind {
            Collective::AllReduce => comm.all_reduce_sum(&mut whole)?,
            Collective::ReduceScatter => comm.reduce_scatter_sum(&whole, &mut part)?,
            _ => comm.all_gather(&part, &mut whole)?,
        }
        if i >= 2 {
            times.push(started.elapsed().as_secs_f64());
        }
        whole.fill(0.5);
    }
    Ok(median(&mut times))
}

/// Under mpirun (the `mpi` build): headroom's MPI communicator and plain MPI, rank 0 reporting.
#[cfg(feature = "mpi")]
mod mpi {
    use super::*;
    use headroom_comm::MpiRank;

    /// Both MPI transports' rows on rank 0 of an mpirun job; `None` when not launched by one.
    pub fn measure(options: &CollectivesOptions) -> Result<Option<CollectivesRun>, BenchError> {
        if !headroom_comm::launched_by_mpirun() {
            return Ok(None);
        }
        let mut rank = MpiRank::init(Duration::from_secs(120)).ok_or(BenchError::MpiInitialized)?;
        let ranks = rank.world_size();
        let ours = time_all(options, &mut |kind, n| {
            time_kind(&mut rank, kind, n, options.reps)
        })?;
        let plain = time_all(options, &mut |kind, n| {
            Ok(time_plain(&mut rank, kind, n, options.reps))
        })?;
        // The slowest rank's time of each: gathered to every rank.
        let mut rows = Vec::new();
        for (transport, times) in [("mpi (headroom)", ours), ("mpi (plain)", plain)] {
            let mine: Vec<f32> = times.iter().map(|&t| t as f32).collect();
            let mut all = vec![0.0f32; mine.len() * ranks];
            rank.all_gather(&mine, &mut all)?;
            let per_rank: Vec<Vec<f64>> = all
                .chunks_exact(mine.len())
                .map(|c| c.iter().map(|&t| f64::from(t)).collect())
                .collect();
            rows.extend(to_rows(options, transport, ranks, &slowest(&per_rank)));
        }
        rank.complete();
        Ok(Some(if rank.rank() == 0 {
            CollectivesRun::Rows(rows)
        } else {
            CollectivesRun::OtherRank
        }))
    }

    /// Median seconds per call of plain MPI's `kind` on `n` elements.
    fn time_plain(rank: &mut MpiRank, kind: Collective, n: usize, reps: usize) -> f64 {
        let world = rank.world_size();
        let n = round_to(n, world);
        let input = vec![0.5f32; n];
        let mut whole = vec![0.5f32; n];
        let mut part = vec![0.5f32; n / world];
        let mut times = Vec::with_capacity(reps);
        for i in 0..reps + 2 {
            rank.plain_barrier();
            let started = Instant::now();
            match kind {
                Collective::AllReduce => rank.plain_all_reduce_sum(&input, &mut whole),
                Collective::ReduceScatter => rank.plain_reduce_scatter_sum(&whole, &mut part),
                _ => rank.plain_all_gather(&part, &mut whole),
            }
            if i >= 2 {
                times.push(started.elapsed().as_secs_f64());
            }
            whole.fill(0.5);
        }
        median(&mut times)
    }
}

#[cfg(not(feature = "mpi"))]
mod mpi {
    use super::*;

    /// Without the `mpi` build there is no MPI job to measure.
    pub fn measure(_: &CollectivesOptions) -> Result<Option<CollectivesRun>, BenchError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_follows_the_ring_factors() {
        // 1e6 f32 elements (4 MB) in 1 ms: 4 GB/s of algorithm bandwidth.
        let r = Row::new("threads", 4, Collective::AllReduce, 1_000_000, 1e-3);
        assert!((r.algorithm_gb_per_s - 4.0).abs() < 1e-9);
        // All-reduce at 4 ranks: 2 · 3/4 = 1.5.
        assert!((r.bus_gb_per_s - 6.0).abs() < 1e-9);
        for kind in [Collective::ReduceScatter, Collective::AllGather] {
            // The others at 4 ranks: 3/4.
            let r = Row::new("threads", 4, kind, 1_000_000, 1e-3);
            assert!((r.bus_gb_per_s - 3.0).abs() < 1e-9, "{kind}");
        }
    }

    #[test]
    fn sizes_round_up_to_equal_chunks() {
        assert_eq!(round_to(10, 4), 12);
        assert_eq!(round_to(12, 4), 12);
        assert_eq!(round_to(0, 3), 3);
    }

    #[test]
    fn one_rank_is_refused() {
        let options = CollectivesOptions {
            ranks: vec![2, 1],
            elements: vec![8],
            reps: 1,
        };
        assert!(matches!(measure(&options), Err(BenchError::TooFewRanks(1))));
    }

    #[test]
    fn a_thread_group_gives_one_row_per_collective_and_size() {
        let options = CollectivesOptions {
            ranks: vec![3],
            elements: vec![7, 30],
            reps: 1,
        };
        let CollectivesRun::Rows(rows) = measure(&options).unwrap() else {
            panic!("threads report rows");
        };
        let got: Vec<(Collective, usize)> =
            rows.iter().map(|r| (r.collective, r.elements)).collect();
        use Collective::*;
        // 7 rounds up to 9 and 30 stays 30 at 3 ranks; collectives in all-reduce,
        // reduce-scatter, all-gather order.
        assert_eq!(
            got,
            [
                (AllReduce, 9),
                (AllReduce, 30),
                (ReduceScatter, 9),
                (ReduceScatter, 30),
                (AllGather, 9),
                (AllGather, 30)
            ]
        );
        assert!(
            rows.iter()
                .all(|r| r.ranks == 3 && r.transport == "threads")
        );
    }
}
