//! `headroom bench collectives`: the bandwidth of headroom's communicators, per collective and
//! size — the in-process thread group at each `--ranks`, and under `mpirun` (the `mpi` build)
//! the MPI communicator against plain MPI on the same buffers (`MPI_Allreduce`,
//! `MPI_Reduce_scatter_block`, `MPI_Allgather`). Figures follow nccl-tests' conventions
//! (docs/sources.md §14): the algorithm bandwidth is the collective's data size over its time, the
//! bus bandwidth that times 2(N−1)/N for an all-reduce and (N−1)/N for the others, the
//! per-link rate a ring would need.
//!
//! Not for: the speed model's collective rates (measured by `--auto` at the run's world size).

use anyhow::Result;
use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_comm::{Collective, CommError, Communicator, ThreadGroup};
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct CollectivesBenchArgs {
    /// Thread-group sizes to measure (ignored under mpirun, where the job's size is the group).
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4])]
    pub ranks: Vec<usize>,
    /// Elements (f32) of each collective's data: an all-reduce's buffer, a reduce-scatter's
    /// input, an all-gather's output.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize << 14, 1 << 18, 1 << 22])]
    pub elements: Vec<usize>,
    /// Timed calls per collective and size (after 2 warm-up calls); the median is reported.
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
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

const KINDS: [Collective; 3] = [
    Collective::AllReduce,
    Collective::ReduceScatter,
    Collective::AllGather,
];

/// What this process measured under mpirun.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))] // only the mpi build leads or follows
enum MpiJob {
    /// Not started by mpirun: measure thread groups.
    NotLaunched,
    /// Rank 0 prints every rank's slowest times.
    Lead(Vec<Row>),
    /// Another rank: nothing to print.
    Follower,
}

pub fn run(args: CollectivesBenchArgs) -> Result<()> {
    match mpi::rows(&args)? {
        MpiJob::Lead(rows) => return print(&args, &rows),
        MpiJob::Follower => return Ok(()),
        MpiJob::NotLaunched => {}
    }
    let mut rows = Vec::new();
    for &ranks in &args.ranks {
        anyhow::ensure!(
            ranks >= 2,
            "--ranks {ranks}: a collective needs at least 2 ranks"
        );
        let results = ThreadGroup::run(ranks, Duration::from_secs(120), |mut rank| {
            time_all(&args, &mut |kind, n| {
                time_kind(&mut rank, kind, n, args.reps)
            })
        });
        let mut per_rank: Vec<Vec<f64>> = Vec::new();
        for r in results {
            per_rank.push(r.map_err(|_| anyhow::anyhow!("a rank panicked"))??);
        }
        rows.extend(to_rows(&args, "threads", ranks, &slowest(&per_rank)));
    }
    print(&args, &rows)
}

/// Median seconds of every (collective, size), in `KINDS` × `elements` order, from `time`.
fn time_all(
    args: &CollectivesBenchArgs,
    time: &mut dyn FnMut(Collective, usize) -> Result<f64, CommError>,
) -> Result<Vec<f64>, CommError> {
    let mut out = Vec::new();
    for kind in KINDS {
        for &n in &args.elements {
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

fn to_rows(args: &CollectivesBenchArgs, transport: &str, ranks: usize, times: &[f64]) -> Vec<Row> {
    let mut t = times.iter();
    KINDS
        .iter()
        .flat_map(|&kind| args.elements.iter().map(move |&n| (kind, n)))
        .map(|(kind, n)| {
            Row::new(
                transport,
                ranks,
                kind,
                round_to(n, ranks),
                *t.next().unwrap(),
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

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn print(args: &CollectivesBenchArgs, rows: &[Row]) -> Result<()> {
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "rows": rows }))?
        );
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "transport",
        "ranks",
        "collective",
        "elements",
        "median time",
        "algorithm GB/s",
        "bus GB/s",
    ]);
    for r in rows {
        table.add_row(vec![
            r.transport.clone(),
            r.ranks.to_string(),
            r.collective.to_string(),
            r.elements.to_string(),
            format!("{:.1} µs", r.seconds * 1e6),
            format!("{:.2}", r.algorithm_gb_per_s),
            format!("{:.2}", r.bus_gb_per_s),
        ]);
    }
    println!("{table}");
    Ok(())
}

/// Under mpirun (the `mpi` build): headroom's MPI communicator and plain MPI, rank 0 printing.
#[cfg(feature = "mpi")]
mod mpi {
    use super::*;
    use headroom_comm::MpiRank;

    /// Both MPI transports' rows on rank 0 of an mpirun job.
    pub fn rows(args: &CollectivesBenchArgs) -> Result<MpiJob> {
        if !headroom_comm::launched_by_mpirun() {
            return Ok(MpiJob::NotLaunched);
        }
        let mut rank = MpiRank::init(Duration::from_secs(120))
            .ok_or_else(|| anyhow::anyhow!("MPI was initialized twice"))?;
        let ranks = rank.world_size();
        let ours = time_all(args, &mut |kind, n| {
            time_kind(&mut rank, kind, n, args.reps)
        })?;
        let plain = time_all(args, &mut |kind, n| {
            Ok(time_plain(&mut rank, kind, n, args.reps))
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
            rows.extend(to_rows(args, transport, ranks, &slowest(&per_rank)));
        }
        rank.complete();
        Ok(if rank.rank() == 0 {
            MpiJob::Lead(rows)
        } else {
            MpiJob::Follower
        })
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
    pub fn rows(_: &CollectivesBenchArgs) -> Result<MpiJob> {
        Ok(MpiJob::NotLaunched)
    }
}
