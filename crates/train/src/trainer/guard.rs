//! Out-of-memory recovery and the leak guard.
//!
//! Recovery: when a step runs out of memory before it changes any weight, the trainer drops what
//! the step held (its tape and partial gradients), rewinds the data and RNG to the step's start,
//! halves the micro-batch and doubles the accumulation (the same effective batch), and runs the
//! step again. A micro-batch of one that does not fit ends with the OOM message.
//!
//! Leak guard: after warm-up, the bytes each category holds between steps, and each step's
//! allocated peak, must stay constant. Growth of either is reported once, naming the category
//! and the allocations (by name) that multiplied or grew — the classic causes are tensors kept
//! in a list, a graph kept alive, gradients never cleared, a buffer that grows every step. The
//! step's peak comes from the allocator's measurement window, opened at every step's start; the
//! guard speaks when the step's rise above the bytes it started with sets a new maximum in two
//! consecutive steps (one new maximum can follow a warm-up step the loss scaler skipped).
//!
//! Not for: choosing a micro-batch up front (the planner's dry run).

use super::{TrainError, TrainEvent, Trainer};
use crate::data::DataPosition;
use headroom_memory::allocator::Window;
use headroom_memory::size::format_bytes;
use headroom_memory::{CachingAllocator, Category, CategoryBytes, OutOfMemory};
use headroom_tensor::rng::RngState;
use std::collections::BTreeMap;

/// Steps before the steady state is taken (optimizer state and caches exist from step 1).
const WARMUP_STEPS: u64 = 2;

/// Live allocations counted by (category, name).
type Census = BTreeMap<(Category, String), usize>;

/// Live allocations between steps: bytes per category and a census of names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeakGuard {
    baseline: Option<(CategoryBytes, Census)>,
    warned: bool,
    /// The window of the step that ended the warm-up.
    peak_baseline: Option<Window>,
    /// The largest rise above the held bytes seen since, and how many consecutive steps have
    /// just exceeded it.
    peak_max: u64,
    peak_records: u32,
    peak_warned: bool,
}

fn census(allocator: &CachingAllocator) -> Census {
    let mut out = BTreeMap::new();
    for seg in allocator.segments() {
        for b in seg.blocks {
            if let Some(c) = b.category {
                let name = b.name.as_deref().unwrap_or("(unnamed)").to_string();
                *out.entry((c, name)).or_insert(0) += 1;
            }
        }
    }
    out
}

impl Trainer {
    /// Drops the failed step's work, halves the micro-batch and retries, or gives up.
    pub(super) fn recover_from_oom(
        &mut self,
        oom: OutOfMemory,
        position: DataPosition,
        rng: RngState,
        on_event: &mut dyn FnMut(TrainEvent),
    ) -> Result<(), TrainError> {
        // The failed attempt's phases are not the step's: the retry records them again.
        let failed = self.step;
        self.report.phases.retain(|p| p.step != failed);
        let micro = self.config.micro_batch();
        if micro < 2 || !micro.is_multiple_of(2) {
            return Err(TrainError::OutOfMemory(oom));
        }
        self.zero_grads()?;
        self.backward_passes = 0;
        self.sampler.seek(position);
        headroom_tensor::rng::set_state(rng);
        self.config = self
            .config
            .with_split(micro / 2, self.config.accumulation() * 2);
        let message = format!(
            "step {} ran out of memory ({} requested); retrying with micro-batch {} × accumulation {} (same effective batch of {})",
            self.step,
            format_bytes(oom.requested),
            self.config.micro_batch(),
            self.config.accumulation(),
            self.config.effective_batch()
        );
        self.report.warnings.push(message);
        on_event(TrainEvent::OomRecovered {
            step: self.step,
            micro_batch: self.config.micro_batch(),
            accumulation: self.config.accumulation(),
        });
        Ok(())
    }

    /// A rank of a group ran out of memory: the others are (or will be) waiting for it in a
    /// collective, so instead of retrying alone it marks itself failed, which releases them at
    /// once with the reason, and the whole group ends with it.
    pub(super) fn group_out_of_memory(&mut self, oom: OutOfMemory) -> TrainError {
        let (rank, world) = self.group_rank();
        let e = TrainError::GroupOutOfMemory {
            rank,
            world,
            step: self.step,
            oom: Box::new(oom),
        };
        if let Some(comm) = self.comm.as_mut() {
            comm.fail(&e.to_string());
        }
        if let Some(g) = &self.tensor_parallel {
            g.with_comm(|c| c.fail(&e.to_string()));
        }
        e
    }

    /// Compares the bytes held between steps, and the step's peak, with the steady state after
    /// warm-up.
    pub(super) fn check_leaks(&mut self, on_event: &mut dyn FnMut(TrainEvent)) {
        self.check_step_peak(on_event);
        if self.leak_guard.warned || self.step < WARMUP_STEPS {
            return;
        }
        let allocator = self.device.lock();
        let now = allocator.stats().current_category_bytes();
        let Some((base, base_census)) = &self.leak_guard.baseline else {
            self.leak_guard.baseline = Some((now, census(&allocator)));
            return;
        };
        let grown: Vec<Category> = Category::ALL
            .into_iter()
            .filter(|&c| now[c] > base[c])
            .collect();
        let Some(&category) = grown.first() else {
            return;
        };
        let current = census(&allocator);
        let mut culprits: Vec<String> = current
            .iter()
            .filter(|((c, _), _)| *c == category)
            .filter_map(|((_, name), &n)| {
                let before = base_census
                    .get(&(category, name.clone()))
                    .copied()
                    .unwrap_or(0);
                (n > before).then(|| format!("{name} ×{}", n - before))
            })
            .collect();
        culprits.truncate(8);
        let message = format!(
            "memory leak: `{category}` bytes held between steps grew from {} at step {WARMUP_STEPS} to {} at step {}; allocations that multiplied: {}. Classic causes: tensors kept in a list (log loss.item(), not the loss), a graph kept alive, gradients never cleared.",
            format_bytes(base[category]),
            format_bytes(now[category]),
            self.step,
            if culprits.is_empty() {
                "(none named)".to_string()
            } else {
                culprits.join(", ")
            }
        );
        drop(allocator);
        self.leak_guard.warned = true;
        self.report.warnings.push(message.clone());
        on_event(TrainEvent::Warning(message));
    }

    /// Compares the step's allocated peak (its measurement window) with the warm-up's last.
    fn check_step_peak(&mut self, on_event: &mut dyn FnMut(TrainEvent)) {
        if self.leak_guard.peak_warned || self.step < WARMUP_STEPS {
            return;
        }
        let allocator = self.device.lock();
        let Some(window) = allocator.window() else {
            return;
        };
        let Some(base) = &self.leak_guard.peak_baseline else {
            self.leak_guard.peak_baseline = Some(window.clone());
            self.leak_guard.peak_max = window.rise();
            return;
        };
        // Growth of what is held between steps raises every later peak too; that is the other
        // check's to report. This one watches what the step itself adds on top. One new maximum
        // can be innocent (a warm-up step the loss scaler skipped has no update to peak in);
        // a leak sets new ones step after step.
        if window.rise() <= self.leak_guard.peak_max {
            self.leak_guard.peak_records = 0;
            return;
        }
        self.leak_guard.peak_max = window.rise();
        self.leak_guard.peak_records += 1;
        if self.leak_guard.peak_records < 2 {
            return;
        }
        let category = Category::ALL
            .into_iter()
            .max_by_key(|&c| window.at_peak[c].saturating_sub(base.at_peak[c]))
            .unwrap_or(Category::Other);
        let mut grown: Vec<String> = window
            .grown_names(base)
            .into_iter()
            .map(|(name, now, before)| {
                format!(
                    "{name} ({}: {} → {})",
                    now.category.map_or("?".to_string(), |c| c.to_string()),
                    format_bytes(before),
                    format_bytes(now.peak)
                )
            })
            .collect();
        grown.truncate(8);
        let message = format!(
            "memory leak: the step's peak grew from {} at step {WARMUP_STEPS} to {} at step {} (above the bytes held between steps: {} → {}; `{category}` at the peak {} → {}); allocations that grew within the step: {}. A step should peak at the same bytes every time: look for buffers that grow with the step (concatenated histories, caches) or graphs kept into the next step.",
            format_bytes(base.peak),
            format_bytes(window.peak),
            self.step,
            format_bytes(base.rise()),
            format_bytes(window.rise()),
            format_bytes(base.at_peak[category]),
            format_bytes(window.at_peak[category]),
            if grown.is_empty() {
                "(none named)".to_string()
            } else {
                grown.join(", ")
            }
        );
        drop(allocator);
        self.leak_guard.peak_warned = true;
        self.report.warnings.push(message.clone());
        on_event(TrainEvent::Warning(message));
    }
}
