//! `MpiRank`: one process of an `mpirun` job as a rank (the `mpi` feature; Open MPI through the
//! `mpi` crate). Collectives give the same results as the thread group's, bitwise: MPI's own
//! reduction order is the library's choice, so a reduce-scatter is an `MPI_Alltoall` (chunk r
//! of every rank's input reaches rank r) summed here in rank order, and an all-reduce is that
//! reduce-scatter followed by an `MPI_Allgather` of the summed chunks — each rank sends
//! 2(N−1)/N of the data, as a ring all-reduce does. Before each collective the ranks exchange
//! what they are about to call, so a mismatch is an error instead of a hang.
//!
//! MPI errors are fatal by design, and the `mpi` crate finalizes MPI when its universe drops —
//! which would hang the job if a panicking rank unwound into it while the others wait. So a
//! panic aborts the process (mpirun then ends the job, naming the rank), and a watchdog thread
//! aborts a rank whose collective outlives the deadline, naming the rank and the collective.
//!
//! Not for: one process (see `thread_group`).

use crate::communicator::{Collective, CollectiveCounts, CommError, Communicator};
use mpi::Threading;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// This process's rank of the MPI world.
pub struct MpiRank {
    // Field order: the world is dropped before the universe (which finalizes MPI).
    world: SimpleCommunicator,
    /// Finalizes MPI when dropped — only when the rank completed (see `Drop`).
    universe: ManuallyDrop<Universe>,
    rank: usize,
    size: usize,
    sequence: u64,
    counts: CollectiveCounts,
    /// The collective in progress and since when, for the watchdog.
    waiting: Arc<Mutex<Option<(Instant, Collective, u64)>>>,
    /// Set when the rank's work completed; dropped without it, the rank failed.
    completed: bool,
}

// SAFETY: MPI is initialized at `Threading::Serialized`, which allows calls from any thread as
// long as no two overlap; every MPI call here goes through `&mut self` (or `&self` of a value
// owned by one thread at a time), and the watchdog thread makes none.
unsafe impl Send for MpiRank {}

impl std::fmt::Debug for MpiRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiRank")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

/// Whether this process was started by `mpirun`/`mpiexec` (Open MPI or a PMI launcher).
pub fn launched_by_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

impl MpiRank {
    /// Initializes MPI; a collective waiting longer than `deadline` aborts the job. `None` if
    /// MPI was already initialized.
    pub fn init(deadline: Duration) -> Option<MpiRank> {
        // Serialized: any thread may call MPI, never two at once (every call takes `&mut self`).
        let (universe, _) = mpi::initialize_with_threading(Threading::Serialized)?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            eprintln!("rank {rank}: panicked; aborting the MPI job");
            std::process::abort();
        }));
        let waiting: Arc<Mutex<Option<(Instant, Collective, u64)>>> = Arc::new(Mutex::new(None));
        let watched = Arc::clone(&waiting);
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let stuck = watched
                    .lock()
                    .ok()
                    .and_then(|w| *w)
                    .filter(|(since, ..)| since.elapsed() > deadline);
                if let Some((_, collective, sequence)) = stuck {
                    eprintln!(
                        "rank {rank}: {collective} #{sequence} still waiting after {deadline:?}: a rank is stuck or dead; aborting the MPI job"
                    );
                    std::process::abort();
                }
            }
        });
        Some(MpiRank {
            world,
            universe: ManuallyDrop::new(universe),
            rank,
            size,
            sequence: 0,
            counts: CollectiveCounts::default(),
            waiting,
            completed: false,
        })
    }

    /// Agrees with every rank on the collective about to run; returns every rank's length.
    fn agree(&mut self, kind: Collective, len: usize, root: usize) -> Result<(), CommError> {
        if let Ok(mut w) = self.waiting.lock() {
            *w = Some((Instant::now(), kind, self.sequence));
        }
        let mine = [kind as u64, len as u64, root as u64];
        let mut all = vec![0u64; 3 * self.size];
        self.world.all_gather_into(&mine[..], &mut all[..]);
        let sequence = self.sequence;
        self.sequence += 1;
        self.counts.record(kind, len);
        for (other, theirs) in all.chunks_exact(3).enumerate() {
            if theirs != mine {
                return Err(CommError::Mismatch {
                    rank: self.rank,
                    sequence,
                    ours: kind,
                    our_len: len,
                    other,
                    theirs: kind_of(theirs[0]),
                    their_len: theirs[1] as usize,
                });
            }
        }
        Ok(())
    }

    /// The collective in progress has ended: the watchdog stops watching it, and its time is
    /// added to the time spent inside collectives.
    fn done(&mut self) {
        if let Ok(mut w) = self.waiting.lock()
            && let Some((began, _, _)) = w.take()
        {
            self.counts.add_busy(began);
        }
    }

    /// The MPI world this rank belongs to (for `mpi_plain`'s comparisons).
    pub(crate) fn world(&self) -> &SimpleCommunicator {
        &self.world
    }

    /// This rank's chunk (of `chunk` elements) of the rank-order sum of every rank's `input`
    /// (`size` chunks), through one all-to-all.
    fn summed_chunk(&self, input: &[f32], chunk: usize, out: &mut [f32]) {
        let mut parts = vec![0.0f32; chunk * self.size];
        self.world.all_to_all_into(input, &mut parts[..]);
        sum_parts(&parts, out);
    }
}

fn kind_of(code: u64) -> Collective {
    match code {
        0 => Collective::AllReduce,
        1 => Collective::ReduceScatter,
        2 => Collective::AllGather,
        3 => Collective::Broadcast,
        _ => Collective::Barrier,
    }
}

/// `out[i] = parts[0][i] + parts[1][i] + …` over `out.len()`-element parts, in rank order.
fn sum_parts(all: &[f32], out: &mut [f32]) {
    let mut parts = all.chunks_exact(out.len().max(1));
    if let Some(first) = parts.next() {
        out.copy_from_slice(&first[..out.len()]);
    }
    for part in parts {
        for (o, x) in out.iter_mut().zip(part) {
            *o += *x;
        }
    }
}

impl Communicator for MpiRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CommError> {
        self.agree(Collective::AllReduce, data.len(), 0)?;
        let chunk = data.len().div_ceil(self.size).max(1);
        let mut mine = vec![0.0f32; chunk];
        if data.len() == chunk * self.size {
            self.summed_chunk(data, chunk, &mut mine);
            self.world.all_gather_into(&mine[..], data);
        } else {
            // Padded to equal chunks (pads are zero and dropped after).
            let mut padded = data.to_vec();
            padded.resize(chunk * self.size, 0.0);
            self.summed_chunk(&padded, chunk, &mut mine);
            self.world.all_gather_into(&mine[..], &mut padded[..]);
            data.copy_from_slice(&padded[..data.len()]);
        }
        self.done();
        Ok(())
    }

    fn reduce_scatter_sum(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError> {
        if input.len() != output.len() * self.size {
            return Err(CommError::BadArguments {
                rank: self.rank,
                collective: Collective::ReduceScatter,
                reason: format!(
                    "an input of {} elements for {} ranks of {}",
                    input.len(),
                    self.size,
                    output.len()
                ),
            });
        }
        self.agree(Collective::ReduceScatter, input.len(), 0)?;
        self.summed_chunk(input, output.len(), output);
        self.done();
        Ok(())
    }

    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError> {
        if output.len() != input.len() * self.size {
            return Err(CommError::BadArguments {
                rank: self.rank,
                collective: Collective::AllGather,
                reason: format!(
                    "an output of {} elements for {} ranks of {}",
                    output.len(),
                    self.size,
                    input.len()
                ),
            });
        }
        self.agree(Collective::AllGather, input.len(), 0)?;
        self.world.all_gather_into(input, output);
        self.done();
        Ok(())
    }

    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CommError> {
        self.agree(Collective::Broadcast, data.len(), root)?;
        self.world.process_at_rank(root as i32).broadcast_into(data);
        self.done();
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.agree(Collective::Barrier, 0, 0)?;
        self.world.barrier();
        self.done();
        Ok(())
    }

    fn fail(&mut self, reason: &str) {
        eprintln!("rank {}: {reason}; aborting the MPI job", self.rank);
        self.world.abort(1);
    }

    fn counts(&self) -> CollectiveCounts {
        self.counts
    }

    fn complete(&mut self) {
        self.completed = true;
    }
}

impl Drop for MpiRank {
    /// A rank that ends without completing (an error returned early) must not finalize MPI:
    /// Open MPI's finalize would wait for the other ranks, which wait in a collective for this
    /// one, and the job would hang. It leaves MPI as it is; the process then exits with its
    /// error, and mpirun, seeing a rank exit without finalizing, ends the job.
    fn drop(&mut self) {
        if self.completed {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.universe) };
        }
    }
}
