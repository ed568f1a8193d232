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
//! Results do not change: the kernels are deterministic whatever thread runs them.
//!
//! Not for: runs whose ranks are threads of this process (each rank is its own thread; moving
//! one onto a worker would take that worker from the others' kernels).

/// Runs `work` on a worker of the kernel pool and returns its result; the calling thread
/// sleeps until it is done. Thread-local state (autocast, grad mode, block hooks) lives on
/// that worker for the whole of `work`, as it would on the caller.
pub fn on_kernel_threads<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    // `scope` runs its body on a worker of the global pool (the caller blocks on a latch).
    rayon::scope(|_| work())
}
