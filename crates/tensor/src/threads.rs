//! Where a run's driving thread executes: on one of the kernel pool's workers, so that the run
//! uses as many threads as the pool has (one per core) instead of one more.
//!
//! The CPU kernels split their work over rayon's global pool, which has one worker per core. A
//! training loop driven from the process's main thread adds a thread: while it runs serial work
//! (the tape, small ops, the optimizer's bookkeeping) the idle workers spin (`sched_yield`)
//! before sleeping and take cores from it, and when it waits for a parallel kernel it sleeps
//! while the workers run. Driven from a worker instead, the serial work runs on that worker's
//! core and the parallel kernels split across the same threads: on a 2-core machine this
//! measured about 10 % more tokens/s, in fp32 and bf16-mixed alike (`docs/benchmarks.md`).
//!
//! Ranks that are threads of one process each get a kernel pool of their own
//! ([`on_own_kernel_threads`]): the global pool's threads divided among them, the rank's driver
//! on its pool's worker. Sharing the global pool, two ranks on two cores ran four threads that
//! took cores from each other: a rank's step was 1.5× that of one rank alone on one thread
//! (`docs/benchmarks.md`, "DDP on threads against one process accumulating").
//!
//! Results do not change: the kernels are deterministic whatever thread runs them, and split
//! their work the same way whatever the thread count.

/// Runs `work` on a worker of the kernel pool and returns its result; the calling thread
/// sleeps until it is done. Thread-local state (autocast, grad mode, block hooks) lives on
/// that worker for the whole of `work`, as it would on the caller.
pub fn on_kernel_threads<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    // `scope` runs its body on a worker of the global pool (the caller blocks on a latch).
    rayon::scope(|_| work())
}

/// The kernel threads each of `ranks` ranks sharing this process gets: the global pool's
/// threads (one per core, or `RAYON_NUM_THREADS`) divided among them, at least one.
pub fn threads_per_rank(ranks: usize) -> usize {
    (rayon::current_num_threads() / ranks.max(1)).max(1)
}

/// Runs `work` on a worker of a kernel pool of `threads` threads of its own (the kernels `work`
/// runs split over that pool), and returns its result; for one rank of several in a process.
/// A pool that cannot be built (the system refuses threads) leaves `work` on the global pool.
pub fn on_own_kernel_threads<R: Send>(threads: usize, work: impl FnOnce() -> R + Send) -> R {
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("headroom-rank-kernel-{i}"))
        .build()
    {
        Ok(pool) => pool.install(work),
        Err(_) => work(),
    }
}
