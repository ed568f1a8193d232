//! Launching a prepared run: its ranks — one process alone, threads of this process, or the one
//! rank of an `mpirun` job this process is — each build their trainer from the prepared run
//! (with their rank's arena layout), resume, train, save when a stop was asked for, and gather
//! every rank's peaks into rank 0's report. The caller gets rank 0's report and device; progress
//! goes to the caller's observer.
//!
//! Not for: deciding what runs (`prepare`), or parsing, printing and writing outputs (the
//! binary does those).

use crate::data::Corpus;
use crate::predict::prepare::PreparedRun;
use crate::report::TrainReport;
use crate::trainer::{Fault, TrainError, TrainEvent, Trainer, TrainerHooks, fault_for_rank};
use headroom_comm::{CommError, Communicator, ThreadGroup};
use headroom_memory::Device;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Where a run stopped by a request is saved when its configuration names no save directory.
pub const DEFAULT_SAVE_DIR: &str = "headroom-save";

/// What rank 0 tells its observer as the run goes.
#[derive(Debug)]
pub enum LaunchEvent<'a> {
    /// Rank 0's trainer is built (and resumed): training starts after `trainer.step()`.
    Ready(&'a Trainer),
    /// An event of rank 0's training.
    Train(TrainEvent),
    /// Rank 0's training ended, successfully or not (its save and the gathering follow).
    Trained,
    /// A stop request ended the run and it is saved (before the ranks' peaks are gathered).
    Stopped(&'a Stopped),
}

/// Rank 0's observer of the run.
pub type Observer = Arc<dyn Fn(LaunchEvent<'_>) + Send + Sync>;

/// How to launch a prepared run, beyond what it runs.
#[derive(Default)]
pub struct LaunchOptions {
    /// Continue the saved run in this directory (or its step-NNNNNN folder) first.
    pub resume: Option<PathBuf>,
    /// Set from outside (a signal handler) to stop after the step in progress; every rank then
    /// saves the run (into `config.save_dir`, or the first of [`DEFAULT_SAVE_DIR`],
    /// `headroom-save-2`, … that holds no other run's saves: see [`stop_save_dir`]).
    pub stop: Option<Arc<AtomicBool>>,
    /// A fault injected on purpose, `RANK:KIND@STEP` (see [`fault_for_rank`]).
    pub fault: Option<String>,
    /// Allocator trace entries rank 0's device keeps, for a timeline or a snapshot (0: none).
    pub trace_entries: usize,
    /// This process's rank of a job `mpirun` started; without it the ranks of
    /// `config.ranks()` (data- or tensor-parallel) are threads of this process.
    pub process_rank: Option<Box<dyn Communicator>>,
    /// Told rank 0's progress.
    pub observer: Option<Observer>,
}

impl std::fmt::Debug for LaunchOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchOptions")
            .field("resume", &self.resume)
            .field("stop", &self.stop)
            .field("fault", &self.fault)
            .field("trace_entries", &self.trace_entries)
            .field(
                "process_rank",
                &self
                    .process_rank
                    .as_ref()
                    .map(|c| (c.rank(), c.world_size())),
            )
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

/// Where a run stopped by a request ended: its last step, its save and the save directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    pub step: u64,
    pub save: PathBuf,
    pub root: PathBuf,
}

/// A launched run's end as this process saw it.
#[derive(Debug)]
pub struct RunOutcome {
    /// Whether this process ran rank 0 (under `mpirun`, one process does).
    pub lead: bool,
    /// Rank 0's report, with every rank's peaks (a rank other than 0: its own).
    pub report: TrainReport,
    /// Rank 0's device (its allocator trace feeds a timeline or a snapshot).
    pub device: Device,
    /// The model's name.
    pub model: String,
    /// Where the run was saved when a stop request ended it.
    pub stopped: Option<Stopped>,
}

/// Why a launched run failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The error of a process alone, or of a collective (which names the ranks it concerns).
    #[error(transparent)]
    Train(Box<TrainError>),
    /// The error of one rank.
    #[error("rank {rank}")]
    Rank {
        rank: usize,
        #[source]
        source: Box<TrainError>,
    },
    #[error("rank {rank} panicked")]
    Panicked { rank: usize },
    /// The injected fault's specification cannot be read.
    #[error("{0}")]
    Fault(String),
    /// This process's job has another size than the prepared run's number of ranks.
    #[error(
        "this process is a rank of a job of {job} ranks, and the run was prepared for {prepared}: prepare it with data_parallel (or tensor_parallel) = {job}"
    )]
    JobSize { job: usize, prepared: usize },
}

/// Launches `prepared` on `corpus`: see [`launch_inspecting`].
pub fn launch(
    prepared: &PreparedRun,
    corpus: Arc<Corpus>,
    options: LaunchOptions,
) -> Result<RunOutcome, LaunchError> {
    launch_inspecting(prepared, corpus, options, Arc::new(|_| Ok(()))).map(|(outcome, _)| outcome)
}

/// What `inspect` makes of each rank's trainer after training.
pub type Inspect<T> = Arc<dyn Fn(&mut Trainer) -> Result<T, TrainError> + Send + Sync>;

/// Launches `prepared` on `corpus` and returns this process's outcome, with what `inspect` made
/// of each of its ranks' trainers (in rank order), called on every rank after training (and the
/// save of a stopped run), before the ranks' peaks are gathered.
///
/// A group ends with the error of the rank where it happened, before the errors of the ranks
/// it left waiting; a rank stuck past the collective deadline (`--collective-timeout`) ends the
/// launch at once, its thread left behind.
pub fn launch_inspecting<T: Send + 'static>(
    prepared: &PreparedRun,
    corpus: Arc<Corpus>,
    options: LaunchOptions,
    inspect: Inspect<T>,
) -> Result<(RunOutcome, Vec<T>), LaunchError> {
    let world = prepared.config.ranks();
    // Read before any rank starts: each rank takes its own.
    let faults = match &options.fault {
        Some(spec) => (0..world)
            .map(|rank| fault_for_rank(spec, rank))
            .collect::<Result<Vec<_>, _>>()
            .map_err(LaunchError::Fault)?,
        None => Vec::new(),
    };
    let LaunchOptions {
        resume,
        stop,
        trace_entries,
        process_rank,
        observer,
        ..
    } = options;
    // Decided before any rank starts, so that every rank saves a stopped run into one place.
    let stop_root = stop_save_dir(prepared.config.save_dir.as_deref(), Path::new(""));
    let rank_run = Arc::new(RankRun {
        prepared: prepared.clone(),
        corpus,
        resume,
        stop,
        stop_root,
        faults,
        trace_entries,
        observer,
        inspect,
    });
    if let Some(comm) = process_rank {
        if comm.world_size() != world {
            return Err(LaunchError::JobSize {
                job: comm.world_size(),
                prepared: world,
            });
        }
        let rank = comm.rank();
        // An MPI rank stays on the thread that initialised MPI (each rank is its own process).
        let end = rank_run.train(Some(comm)).map_err(|e| on_rank(e, rank))?;
        return Ok(end.into_outcome(rank == 0));
    }
    if world == 1 {
        let end = headroom_tensor::on_kernel_threads(|| rank_run.train(None))
            .map_err(|e| LaunchError::Train(Box::new(e)))?;
        return Ok(end.into_outcome(true));
    }
    thread_ranks(&rank_run, world)
}

/// The ranks of `run` on threads: rank 0's outcome, or the error that ended the group.
fn thread_ranks<T: Send + 'static>(
    run: &Arc<RankRun<T>>,
    world: usize,
) -> Result<(RunOutcome, Vec<T>), LaunchError> {
    let deadline = collective_deadline(Some(run.prepared.config.collective_timeout_s));
    let (sender, ends) = std::sync::mpsc::channel();
    let kernel_threads = headroom_tensor::threads_per_rank(world);
    let threads: Vec<_> = ThreadGroup::ranks(world, deadline)
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let (run, sender) = (Arc::clone(run), sender.clone());
            std::thread::spawn(move || {
                // Each rank's kernels on a pool of its own, its share of the cores.
                let end = catch_unwind(AssertUnwindSafe(|| {
                    headroom_tensor::on_own_kernel_threads(kernel_threads, || {
                        run.train(Some(Box::new(comm)))
                    })
                }));
                // The receiver is gone only once the launch has ended on another rank's error.
                let _ = sender.send((rank, end));
            })
        })
        .collect();
    drop(sender);
    let mut outcomes: Vec<Option<RankOutcome<T>>> = (0..world).map(|_| None).collect();
    for (rank, end) in ends {
        match end {
            // The stuck rank's thread may never return to be joined: it is left behind.
            Ok(Err(e)) if timed_out(&e) => {
                return Err(LaunchError::Rank {
                    rank,
                    source: Box::new(e),
                });
            }
            end => outcomes[rank] = Some(end),
        }
    }
    for thread in threads {
        // Every rank has sent its end: the threads are finishing.
        let _ = thread.join();
    }
    group_outcome(outcomes)
}

/// How one rank ended: its end, its error, or its panic.
type RankOutcome<T> = std::thread::Result<Result<RankEnd<T>, TrainError>>;

/// A thread group's result: rank 0's outcome with every rank's inspection, or the error that
/// ended the group, told by the rank it happened on (its own error or its panic), before the
/// errors of the ranks it left waiting.
fn group_outcome<T>(
    outcomes: Vec<Option<RankOutcome<T>>>,
) -> Result<(RunOutcome, Vec<T>), LaunchError> {
    let mut ends = Vec::new();
    let mut cause = None;
    let mut abandoned = None;
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Some(Ok(Ok(end))) => ends.push(end),
            Some(Ok(Err(e))) => {
                let slot = if left_waiting(&e) {
                    &mut abandoned
                } else {
                    &mut cause
                };
                slot.get_or_insert(on_rank(e, rank));
            }
            Some(Err(_)) | None => {
                cause.get_or_insert(LaunchError::Panicked { rank });
            }
        }
    }
    if let Some(e) = cause.or(abandoned) {
        return Err(e);
    }
    let mut inspected = Vec::with_capacity(ends.len());
    let mut lead = None;
    for end in ends {
        let (outcome, value) = end.split(lead.is_none());
        lead.get_or_insert(outcome);
        inspected.push(value);
    }
    let lead = lead.expect("a group without an error has a rank 0");
    Ok((lead, inspected))
}

/// A rank's error, naming the rank (a collective's error names it already).
fn on_rank(e: TrainError, rank: usize) -> LaunchError {
    match e {
        TrainError::Communication(_) => LaunchError::Train(Box::new(e)),
        source => LaunchError::Rank {
            rank,
            source: Box::new(source),
        },
    }
}

/// Whether a rank's error is only that another rank failed while it waited.
fn left_waiting(e: &TrainError) -> bool {
    matches!(e, TrainError::Communication(CommError::PeerFailed { .. }))
}

/// Whether a rank's error is a collective's deadline passing (a stuck rank).
fn timed_out(e: &TrainError) -> bool {
    matches!(e, TrainError::Communication(CommError::Timeout { .. }))
}

/// How long a rank waits in a collective for the others before the run ends naming the
/// missing ranks (the watchdog of a stuck rank): `seconds`, 600 s when not given or not a
/// positive finite number.
pub fn collective_deadline(seconds: Option<f64>) -> Duration {
    Duration::from_secs_f64(
        seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            // An mpirun rank reads the flag before the configuration is checked (which refuses
            // values beyond the bound); clamp so the conversion cannot panic meanwhile.
            .map(|s| s.min(crate::config::MAX_COLLECTIVE_TIMEOUT_S))
            .unwrap_or(600.0),
    )
}

/// Where a run stopped by a signal is saved: its `--save-dir`, or else the first directory
/// under `cwd` of [`DEFAULT_SAVE_DIR`], `headroom-save-2`, `headroom-save-3`, … into which a new
/// run may save (one that holds no saves: an earlier stopped run's directory is never written
/// over).
pub fn stop_save_dir(save_dir: Option<&Path>, cwd: &Path) -> PathBuf {
    if let Some(dir) = save_dir {
        return dir.to_path_buf();
    }
    (1..)
        .map(|n| match n {
            1 => cwd.join(DEFAULT_SAVE_DIR),
            n => cwd.join(format!("{DEFAULT_SAVE_DIR}-{n}")),
        })
        .find(|dir| crate::save::check_destination(dir, None).is_ok())
        .expect("some numbered directory holds no saves")
}

/// Everything one rank needs to train.
struct RankRun<T> {
    prepared: PreparedRun,
    corpus: Arc<Corpus>,
    resume: Option<PathBuf>,
    stop: Option<Arc<AtomicBool>>,
    /// Where a run stopped by `stop` is saved.
    stop_root: PathBuf,
    /// Each rank's injected fault (empty: none injected).
    faults: Vec<Option<Fault>>,
    trace_entries: usize,
    observer: Option<Observer>,
    inspect: Inspect<T>,
}

/// How one rank ended.
struct RankEnd<T> {
    report: TrainReport,
    device: Device,
    model: String,
    stopped: Option<Stopped>,
    inspected: T,
}

impl<T> RankEnd<T> {
    fn split(self, lead: bool) -> (RunOutcome, T) {
        let outcome = RunOutcome {
            lead,
            report: self.report,
            device: self.device,
            model: self.model,
            stopped: self.stopped,
        };
        (outcome, self.inspected)
    }

    fn into_outcome(self, lead: bool) -> (RunOutcome, Vec<T>) {
        let (outcome, value) = self.split(lead);
        (outcome, vec![value])
    }
}

impl<T> RankRun<T> {
    /// Trains one rank (the only one without `comm`); rank 0 tells the observer, and when a stop
    /// was requested every rank joins the save (ZeRO gathers its shards).
    fn train(&self, comm: Option<Box<dyn Communicator>>) -> Result<RankEnd<T>, TrainError> {
        let config = &self.prepared.config;
        let lead = comm.as_ref().is_none_or(|c| c.rank() == 0);
        let device = Device::cpu(config.device_memory, config.allocator.config());
        if lead && self.trace_entries > 0 {
            device
                .lock()
                .trace_mut()
                .record_history(true, self.trace_entries);
        }
        let mut trainer = Trainer::prepared(&self.prepared, &self.corpus, device.clone(), comm)?;
        if let Some(dir) = &self.resume {
            trainer.resume(dir)?;
        }
        let observer = self.observer.as_ref().filter(|_| lead);
        if let Some(observe) = observer {
            observe(LaunchEvent::Ready(&trainer));
        }
        trainer.set_prepared(&self.prepared);
        if let Some(stop) = &self.stop {
            trainer.set_stop_flag(stop.clone());
        }
        if !self.faults.is_empty() {
            trainer.set_hooks(TrainerHooks {
                fault: self.faults.get(trainer.group_rank().0).copied().flatten(),
                ..Default::default()
            });
        }
        let result = trainer.train(&mut |event| {
            if let Some(observe) = observer {
                observe(LaunchEvent::Train(event));
            }
        });
        if let Some(observe) = observer {
            observe(LaunchEvent::Trained);
        }
        let mut report = result?.clone();
        // A split model has no save format (saves hold whole weights): stopped, it is not saved.
        let split = trainer.config().tensor_parallel.is_some();
        let stopped = match report.stopped_at_step.filter(|_| !split) {
            Some(step) => {
                let root = self.stop_root.clone();
                let save = trainer.save(&root)?;
                let stopped = Stopped { step, save, root };
                if let Some(observe) = observer {
                    observe(LaunchEvent::Stopped(&stopped));
                }
                Some(stopped)
            }
            None => None,
        };
        let inspected = (self.inspect)(&mut trainer)?;
        // Rank 0 reports every rank's peaks; then every collective of the run is behind this
        // rank.
        report.ranks = trainer.gather_rank_peaks()?.to_vec();
        trainer.complete();
        Ok(RankEnd {
            report,
            device,
            model: trainer.model().name().to_string(),
            stopped,
            inspected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signal-stopped run without `--save-dir` saves into `headroom-save` unless an earlier
    /// run's saves are there; then into the next numbered directory, never over them.
    #[test]
    fn a_stopped_run_never_saves_over_an_earlier_runs_default_directory() {
        let cwd = tempfile::tempdir().unwrap();
        let first = cwd.path().join("headroom-save");
        assert_eq!(stop_save_dir(None, cwd.path()), first);
        // An empty directory holds no saves: still usable.
        std::fs::create_dir(&first).unwrap();
        assert_eq!(stop_save_dir(None, cwd.path()), first);
        // An earlier stopped run's save: its `latest` link.
        std::os::unix::fs::symlink("step-000007", first.join("latest")).unwrap();
        assert_eq!(
            stop_save_dir(None, cwd.path()),
            cwd.path().join("headroom-save-2")
        );
        let given = cwd.path().join("mine");
        assert_eq!(stop_save_dir(Some(&given), cwd.path()), given);
    }
}
