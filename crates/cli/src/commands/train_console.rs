//! What rank 0 of `headroom train` says on stderr: the dry run's prediction, how a
//! `budget:SIZE` checkpoint policy was met, the line that says what runs, then the progress.
//!
//! Not for: the report after the run (`crate::report::train_report`).

use super::plan_output::group_digits;
use super::train_resume::print_resume_hint;
use crate::report::progress::Progress;
use crate::signals::StopSignals;
use headroom_memory::size::format_bytes;
use headroom_train::Trainer;
use headroom_train::config::RunConfig;
use headroom_train::launch::{LaunchEvent, Observer};
use headroom_train::predict::Prediction;
use headroom_train::recompute::policy::BudgetDecision;
use std::sync::{Arc, Mutex};

/// Rank 0's progress: how a `budget:SIZE` checkpoint policy was met, what runs, then a bar or
/// lines as it trains; with `hint_on_save`, how to continue as soon as a stopped run is saved.
pub(super) fn lead_observer(
    config: &RunConfig,
    corpus: &str,
    hint_on_save: Option<StopSignals>,
) -> Observer {
    let (config, corpus) = (config.clone(), corpus.to_string());
    let progress = Mutex::new(None::<Progress>);
    Arc::new(move |event| match event {
        LaunchEvent::Ready(trainer) => {
            if let Some(d) = trainer.budget_decision() {
                print_budget_decision(d, trainer.model().depth());
            }
            print_start(trainer, &config, &corpus);
            *lock(&progress) = Some(Progress::new(config.steps, trainer.step(), true));
        }
        LaunchEvent::Train(event) => {
            if let Some(p) = lock(&progress).as_ref() {
                p.event(event);
            }
        }
        LaunchEvent::Trained => {
            if let Some(p) = lock(&progress).take() {
                p.finish();
            }
        }
        LaunchEvent::Stopped(stopped) => {
            if let Some(signal) = hint_on_save.as_ref().and_then(StopSignals::received) {
                print_resume_hint(signal, stopped, config.steps);
            }
        }
    })
}

/// The progress display, whichever thread last held it (drawing cannot leave it half-updated).
fn lock(progress: &Mutex<Option<Progress>>) -> std::sync::MutexGuard<'_, Option<Progress>> {
    progress
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The line that says what runs: model, parameters, precision, data, split, steps and budget.
fn print_start(trainer: &Trainer, config: &RunConfig, corpus: &str) {
    eprintln!(
        "headroom train: {} ({}), {} on {}, micro-batch {} × accumulation {}{} × {} tokens, {} steps, device budget {}{}",
        trainer.model().name(),
        describe_parameters(trainer, config.lora.as_ref()),
        config.strategy.precision,
        corpus,
        config.micro_batch(),
        config.accumulation(),
        match (config.data_parallel, config.tensor_parallel) {
            (_, Some(n)) => format!(" on a mesh of tp {n} × dp 1 (the model split over {n} ranks)"),
            (1, None) => String::new(),
            (n, None) => format!(" × {n} ranks"),
        },
        trainer.seq_len(),
        config.steps,
        format_bytes(config.device_memory),
        if config.ranks() > 1 { " per rank" } else { "" },
    );
}

/// The dry run's prediction for the run about to start; `recovers`: whether the trainer retries
/// a step that runs out of memory. A run whose live peak fits but whose reserved peak does not
/// is told that the planned arena reserves only the live peak.
pub(super) fn print_prediction(prediction: &Prediction, config: &RunConfig, recovers: bool) {
    let budget = config.device_memory;
    let arena = if !prediction.fits
        && config.allocator != headroom_memory::AllocatorKind::Planned
        && prediction.memory.peak_allocated_bytes <= budget
    {
        "; its live peak fits: --allocator planned reserves only that"
    } else {
        ""
    };
    eprintln!(
        "dry run: predicted peak {} allocated, {} reserved of the {} budget ({}{arena}; {:.0} ms)",
        format_bytes(prediction.memory.peak_allocated_bytes),
        format_bytes(prediction.memory.peak_reserved_bytes),
        format_bytes(budget),
        match (prediction.fits, recovers) {
            (true, _) => "fits",
            (false, true) => "does not fit: expect out-of-memory recovery",
            (false, false) => "does not fit: expect an out-of-memory error",
        },
        prediction.seconds * 1e3
    );
}

/// How `budget:SIZE` was met, next to Chen et al.'s planner.
fn print_budget_decision(d: &BudgetDecision, depth: usize) {
    let (plan, cost, peak) = &d.optimal;
    eprintln!(
        "checkpoint budget {}: {} segments recomputing {} of {depth} blocks (activation peak {} in a dry run){}",
        format_bytes(d.budget),
        plan.segments.len(),
        cost.recompute,
        format_bytes(*peak),
        match &d.chen {
            Some((_, c, p)) => format!(
                "; Chen et al.'s planner: {} blocks, peak {}",
                c.recompute,
                format_bytes(*p)
            ),
            None => "; Chen et al.'s planner finds no plan within it".to_string(),
        }
    );
}

/// "N parameters", or with LoRA the trainable adapters against the frozen base (as PEFT's
/// `print_trainable_parameters` puts it).
fn describe_parameters(trainer: &Trainer, lora: Option<&headroom_train::strategy::Lora>) -> String {
    let model = trainer.model();
    let trainable = model.num_params() as u64;
    match lora {
        None => format!("{} parameters", group_digits(trainable)),
        Some(l) => {
            let frozen = model.num_frozen_params() as u64;
            format!(
                "{l}: {} trainable parameters of {} ({:.2} %), the base frozen",
                group_digits(trainable),
                group_digits(trainable + frozen),
                100.0 * trainable as f64 / (trainable + frozen).max(1) as f64
            )
        }
    }
}
