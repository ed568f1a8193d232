//! The phase and step of every event: as the trace states them (headroom's trace, the tracer,
//! `record_function` labels), or read from the Python stacks of a PyTorch snapshot: frames in
//! `torch/optim/` are the optimizer step, `zero_grad` clears gradients, a function named
//! eval/valid/test… is evaluation, the autograd engine's threads record no Python frame (so an
//! event with an empty stack inside a step is backward), and the rest is forward. A step ends
//! where an optimizer step is followed by anything else.
//!
//! Not for: categories (see `lifetimes`), which build on these phases.

use super::events::{Events, Frame, Phase};

/// The phase and step of each event, in event order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeline {
    pub phases: Vec<Option<Phase>>,
    pub steps: Vec<u32>,
    /// The index of the first event of each step after the first.
    pub step_starts: Vec<usize>,
    /// Whether any phase came from the trace itself rather than from its stacks.
    pub stated: bool,
}

impl Timeline {
    pub fn step_count(&self) -> usize {
        self.step_starts.len() + usize::from(!self.phases.is_empty())
    }
}

fn is_optimizer_frame(f: &Frame) -> bool {
    let path = f.filename.replace('\\', "/");
    path.contains("/torch/optim/") || path.contains("/bitsandbytes/optim/")
}

fn is_evaluation_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["eval", "valid", "test", "predict", "inference"]
        .iter()
        .any(|k| n.starts_with(k) || n.contains(&format!("_{k}")))
}

/// The phase a stack shows, if any frame decides it.
fn phase_of_stack<'a>(mut frames: impl Iterator<Item = &'a Frame>) -> Option<Phase> {
    let mut seen_any = false;
    let mut found = None;
    for f in frames.by_ref() {
        seen_any = true;
        if f.name == "zero_grad" {
            return Some(Phase::ZeroGrad);
        }
        if is_optimizer_frame(f) {
            found = found.or(Some(Phase::Optimizer));
        }
        if f.name == "backward"
            && (f.filename.contains("torch/_tensor.py") || f.filename.contains("torch/autograd"))
        {
            found = found.or(Some(Phase::Backward));
        }
        if found.is_none() && is_evaluation_name(&f.name) {
            found = Some(Phase::Evaluation);
        }
    }
    match (found, seen_any) {
        (Some(p), _) => Some(p),
        (None, true) => Some(Phase::Forward),
        (None, false) => None,
    }
}

/// Reads every event's phase and step.
pub fn timeline(events: &Events) -> Timeline {
    let stated = events.events.iter().any(|e| e.phase.is_some());
    let has_frames = events.has_frames();
    let mut phases = Vec::with_capacity(events.events.len());
    let mut last: Option<Phase> = None;
    for e in &events.events {
        let phase = match (e.phase, stated) {
            (Some(p), _) => Some(p),
            // A trace that states phases leaves the others unknown rather than guessed, but a
            // snapshot whose recording thread tagged its phases (`headroom.record`) reads the
            // other threads' events from their stacks.
            (None, true) if !(has_frames && events.untagged_from_stacks) => None,
            (None, _) if has_frames => match phase_of_stack(events.stack(e.stack)) {
                Some(p) => Some(p),
                // The autograd engine's threads record no Python frame.
                None if matches!(
                    last,
                    Some(Phase::Forward | Phase::Backward | Phase::Evaluation)
                ) =>
                {
                    Some(Phase::Backward)
                }
                None => last,
            },
            (None, _) => None,
        };
        if phase.is_some() {
            last = phase;
        }
        phases.push(phase);
    }
    let mut steps = Vec::with_capacity(phases.len());
    let mut step_starts = Vec::new();
    let explicit_steps = events.events.iter().any(|e| e.step.is_some());
    let mut step = 0u32;
    let mut in_optimizer = false;
    let mut stated_step: Option<u32> = None;
    for (i, (e, p)) in events.events.iter().zip(&phases).enumerate() {
        if explicit_steps {
            // Stated steps are numbered as they come: a change of the stated number starts
            // the next one.
            if let Some(s) = e.step {
                match stated_step {
                    Some(prev) if prev != s => {
                        step += 1;
                        step_starts.push(i);
                    }
                    _ => {}
                }
                stated_step = Some(s);
            }
        } else {
            let optimizer = matches!(p, Some(Phase::Optimizer | Phase::ZeroGrad));
            // A step ends when its optimizer step is over and forward or evaluation begins.
            if in_optimizer && matches!(p, Some(Phase::Forward | Phase::Evaluation)) {
                step += 1;
                step_starts.push(i);
            }
            if optimizer {
                in_optimizer = true;
            } else if p.is_some() {
                in_optimizer = false;
            }
        }
        steps.push(step);
    }
    Timeline {
        phases,
        steps,
        step_starts,
        stated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::events::{Action, Event};

    fn frame(file: &str, name: &str) -> Frame {
        Frame {
            filename: file.into(),
            line: 1,
            name: name.into(),
        }
    }

    fn push(ev: &mut Events, frames: &[Frame]) {
        let ids = frames.iter().map(|f| ev.intern_frame(f.clone())).collect();
        let stack = ev.intern_stack(ids);
        ev.push(Event {
            action: Action::Alloc,
            addr: ev.events.len() as u64,
            size: 512,
            stack,
            category: None,
            phase: None,
            step: None,
        });
    }

    #[test]
    fn a_recorded_snapshot_reads_its_untagged_events_from_their_stacks() {
        // `headroom.record` tags the recording thread's forward; an optimizer allocation
        // outside any tag and an autograd-thread one (no frames) are untagged. A snapshot
        // reads them from their stacks; a trace that states phases leaves them unknown.
        let fwd = [frame("train.py", "main")];
        let opt = [
            frame("/site-packages/torch/optim/adamw.py", "_multi_tensor_adamw"),
            frame("train.py", "main"),
        ];
        let mut ev = Events::new();
        push(&mut ev, &fwd);
        ev.events[0].phase = Some(Phase::Forward);
        push(&mut ev, &[]);
        push(&mut ev, &opt);
        assert_eq!(timeline(&ev).phases, vec![Some(Phase::Forward), None, None]);
        ev.untagged_from_stacks = true;
        assert_eq!(
            timeline(&ev).phases,
            vec![
                Some(Phase::Forward),
                Some(Phase::Backward),
                Some(Phase::Optimizer)
            ]
        );
    }

    #[test]
    fn stacks_give_forward_backward_and_the_optimizer_and_steps_end_after_it() {
        let fwd = [
            frame("/site-packages/torch/nn/modules/linear.py", "forward"),
            frame("train.py", "main"),
        ];
        let opt = [
            frame("/site-packages/torch/optim/adamw.py", "_multi_tensor_adamw"),
            frame("train.py", "main"),
        ];
        let zero = [
            frame("/site-packages/torch/optim/optimizer.py", "zero_grad"),
            frame("train.py", "main"),
        ];
        let eval = [
            frame("/site-packages/torch/nn/modules/linear.py", "forward"),
            frame("train.py", "evaluate"),
        ];
        let mut ev = Events::new();
        // Step 0: forward, backward (no frames), optimizer, zero_grad; step 1: forward; then eval.
        push(&mut ev, &fwd);
        push(&mut ev, &[]);
        push(&mut ev, &opt);
        push(&mut ev, &zero);
        push(&mut ev, &fwd);
        push(&mut ev, &[]);
        push(&mut ev, &opt);
        push(&mut ev, &eval);
        let t = timeline(&ev);
        use Phase::*;
        assert_eq!(
            t.phases,
            [
                Forward, Backward, Optimizer, ZeroGrad, Forward, Backward, Optimizer, Evaluation
            ]
            .map(Some)
        );
        assert_eq!(t.steps, [0, 0, 0, 0, 1, 1, 1, 2]);
        assert_eq!(t.step_starts, [4, 7]);
        assert!(!t.stated);
    }

    #[test]
    fn stated_phases_and_steps_win_and_leave_the_rest_unknown() {
        let mut ev = Events::new();
        for (phase, step) in [
            (Some(Phase::Forward), 0),
            (None, 0),
            (Some(Phase::Forward), 1),
        ] {
            ev.push(Event {
                action: Action::Alloc,
                addr: ev.events.len() as u64,
                size: 1,
                stack: 0,
                category: None,
                phase,
                step: Some(step),
            });
        }
        let t = timeline(&ev);
        assert_eq!(t.phases, [Some(Phase::Forward), None, Some(Phase::Forward)]);
        assert_eq!(t.step_starts, [2]);
        assert!(t.stated);
    }

    #[test]
    fn labels_people_write_are_read() {
        assert_eq!(Phase::parse("## forward ##"), Some(Phase::Forward));
        assert_eq!(Phase::parse("optimizer_step"), Some(Phase::Optimizer));
        assert_eq!(Phase::parse("validation"), Some(Phase::Evaluation));
        assert_eq!(Phase::parse("data"), None);
    }
}
