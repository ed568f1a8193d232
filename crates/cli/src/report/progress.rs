//! Training progress on stderr: a bar with loss, throughput and device memory on a terminal,
//! plain lines every ten steps otherwise; silent for ranks other than 0.

use headroom_memory::size::format_bytes;
use headroom_train::TrainEvent;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A progress bar on a terminal, plain lines otherwise; silent for ranks other than 0.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    shown: bool,
}

impl Progress {
    pub(crate) fn new(total: u64, done: u64, shown: bool) -> Progress {
        let bar = (shown && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30.cyan/blue} step {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_position(done);
            bar
        });
        Progress { bar, total, shown }
    }

    pub(crate) fn event(&self, event: TrainEvent) {
        if !self.shown {
            return;
        }
        match event {
            TrainEvent::Step {
                step,
                loss,
                tokens_per_s,
                allocated,
                capacity,
                ..
            } => {
                let msg = format!(
                    "loss {loss:.4} | {:.0} tok/s | device {} / {}",
                    tokens_per_s,
                    format_bytes(allocated),
                    format_bytes(capacity)
                );
                match &self.bar {
                    Some(bar) => {
                        bar.set_position(step);
                        bar.set_message(msg);
                    }
                    None if step == 1 || step.is_multiple_of(10) || step == self.total => {
                        eprintln!("step {step}/{} {msg}", self.total)
                    }
                    None => {}
                }
            }
            TrainEvent::Validation { step, loss } => {
                self.line(format!("step {step}: validation loss {loss:.4}"))
            }
            TrainEvent::CacheEmptied {
                step,
                reserved_before,
                reserved_after,
            } => self.line(format!(
                "step {step}: empty_cache after validation: reserved {} → {}",
                format_bytes(reserved_before),
                format_bytes(reserved_after)
            )),
            TrainEvent::Warning(w) => self.line(format!("warning: {w}")),
            TrainEvent::OomRecovered { step, micro_batch, accumulation } => self.line(format!(
                "step {step}: out of memory; retrying with micro-batch {micro_batch} × accumulation {accumulation}"
            )),
            TrainEvent::Saved { step, path } => {
                self.line(format!("step {step}: saved to {path}"))
            }
            TrainEvent::Exported { path } => {
                self.line(format!("wrote the Hugging Face model to {path}"))
            }
        }
    }

    fn line(&self, text: String) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
