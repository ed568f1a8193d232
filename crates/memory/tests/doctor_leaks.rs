//! The doctor's leak findings, one training loop of `doctor_support` per mistake: each mistake
//! is named with the line that makes the tensor and the line that keeps it; a correct loop
//! yields none, and too few steps are said to be too few.

use crate::doctor_support::{Loop, MIB, Writer, diagnosis, lib, options, trace};
use headroom_memory::category::Category;
use headroom_memory::doctor::{Mistake, diagnose, read_trace};
use serde_json::json;

#[test]
fn a_correct_loop_has_no_finding() {
    for stated in [false, true] {
        let d = diagnosis(Loop::Correct, 5, stated, None);
        assert!(d.leaks.findings.is_empty(), "{:?}", d.leaks.findings);
        assert_eq!(d.leaks.growth_per_step, None);
        // After each zero_grad: parameters, states, the step's logits and loss.
        assert!(
            d.leaks
                .bytes_at_step_end
                .iter()
                .all(|&b| b == 18 * MIB + 512)
        );
    }
}

#[test]
fn a_loss_summed_as_a_tensor_is_named_at_its_line() {
    let d = diagnosis(Loop::LossSummed, 5, false, None);
    // Each step keeps its 512-byte loss.
    assert_eq!(d.leaks.growth_per_step, Some(512));
    let f = &d.leaks.findings;
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].mistake, Mistake::LossKeptWithGraph);
    assert_eq!(f[0].frame.as_ref().unwrap().line, 21);
    assert_eq!(f[0].kept_at, Some((22, "total_loss += loss".to_string())));
    assert_eq!(f[0].bytes, 512);
    // Steps 1 to 3 each keep theirs past the next step's end (the last has no next; the first
    // step's, made before any backward and never freed, reads as model state).
    assert_eq!(f[0].steps, 3);
    assert!(f[0].fix.contains("loss.item()"));
}

#[test]
fn outputs_kept_in_a_list_are_named_with_the_append() {
    let d = diagnosis(Loop::OutputsInList, 5, false, None);
    assert_eq!(d.leaks.growth_per_step, Some(3 * MIB));
    let f = &d.leaks.findings;
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].mistake, Mistake::OutputsKeptInList);
    assert_eq!(f[0].frame.as_ref().unwrap().line, 20);
    assert_eq!(
        f[0].kept_at,
        Some((22, "outputs.append(logits)".to_string()))
    );
    assert_eq!(f[0].bytes, 3 * MIB);
}

#[test]
fn without_the_file_a_kept_scalar_still_reads_as_a_kept_loss() {
    let events = read_trace(&trace(Loop::LossSummed, 5, false)).unwrap();
    let none = |_: &str, _: i64| None;
    let d = diagnose(&events, &options(None, &none));
    assert_eq!(d.leaks.findings[0].mistake, Mistake::LossKeptWithGraph);
    assert_eq!(d.leaks.findings[0].kept_at, None);
}

#[test]
fn gradients_never_cleared_are_found_where_the_trace_states_its_phases() {
    let d = diagnosis(Loop::NoZeroGrad, 4, true, None);
    let f: Vec<_> = d
        .leaks
        .findings
        .iter()
        .filter(|f| f.mistake == Mistake::GradientsNeverCleared)
        .collect();
    assert_eq!(f.len(), 1, "{:?}", d.leaks.findings);
    assert_eq!(f[0].bytes, 5 * MIB);
    // A PyTorch snapshot states no phase: zero_grad(set_to_none=False) frees nothing and
    // records nothing, so the absence of zero_grad is no evidence there.
    let d = diagnosis(Loop::NoZeroGrad, 4, false, None);
    assert!(d.leaks.findings.is_empty(), "{:?}", d.leaks.findings);
}

#[test]
fn two_steps_are_too_few_to_call_a_leak_and_it_says_so() {
    let d = diagnosis(Loop::LossSummed, 2, false, None);
    assert!(d.leaks.findings.is_empty());
    assert!(d.leaks.unchecked.as_ref().unwrap().contains("at least 3"));
    assert!(d.limits.iter().any(|l| l.contains("at least 3")));
}

#[test]
fn evaluation_that_saves_tensors_for_backward_is_named() {
    // As the tracer states it: two evaluation batches at train.py:31, each saving a 2 MiB
    // activation (a forward outside torch.no_grad) freed when its output goes.
    let mut w = Writer::new(true);
    let eval = || {
        vec![
            lib("nn/modules/linear.py", "forward"),
            json!({"filename": "train.py", "line": 31, "name": "evaluate"}),
        ]
    };
    for _ in 0..2 {
        let a = w.alloc(2 * MIB, eval(), Category::Activation, "evaluation");
        let o = w.alloc(MIB, eval(), Category::Temporary, "evaluation");
        w.free(a, eval());
        w.free(o, eval());
    }
    let events = read_trace(&serde_json::to_vec(&w.events).unwrap()).unwrap();
    let none = |_: &str, _: i64| None;
    let d = diagnose(&events, &options(None, &none));
    let f = &d.leaks.findings;
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].mistake, Mistake::EvaluationBuildsGraph);
    assert_eq!(f[0].frame.as_ref().unwrap().line, 31);
    assert_eq!(f[0].bytes, 4 * MIB);
    assert!(f[0].fix.contains("torch.no_grad()"));
}

#[test]
fn a_loss_kept_in_a_list_is_a_kept_loss_not_a_list_of_outputs() {
    // The 512-byte loss of each step stays alive in the list: one scalar block per step.
    let d = diagnosis(Loop::LossInList, 5, false, None);
    let f = &d.leaks.findings;
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].mistake, Mistake::LossKeptWithGraph);
    assert_eq!(f[0].frame.as_ref().unwrap().line, 21);
    assert_eq!(f[0].kept_at, Some((22, "losses.append(loss)".to_string())));
    assert!(f[0].fix.contains("loss.item()"));
}

#[test]
fn the_retainer_is_found_in_the_loop_that_called_the_users_model() {
    // The logits' innermost user frame is model.py:5 (`return self.head(x)`), which keeps
    // nothing; the loop's frame (train.py:20) assigns them and line 22 appends them.
    let d = diagnosis(Loop::OutputsInListUserModel, 5, false, None);
    let f: Vec<_> = d
        .leaks
        .findings
        .iter()
        .filter(|f| f.bytes == 3 * MIB)
        .collect();
    assert_eq!(f.len(), 1, "{:?}", d.leaks.findings);
    assert_eq!(f[0].mistake, Mistake::OutputsKeptInList);
    let frame = f[0].frame.as_ref().unwrap();
    assert_eq!((frame.filename.as_str(), frame.line), ("train.py", 20));
    assert_eq!(
        f[0].kept_at,
        Some((22, "outputs.append(logits)".to_string()))
    );
}

#[test]
fn a_state_fed_back_into_its_own_computation_is_named() {
    // `h = cell(x, h)`: the 3 MiB output of every step stays alive (the next step's graph holds
    // it); no line below appends or sums it.
    let d = diagnosis(Loop::StateCarried, 5, false, None);
    let f = &d.leaks.findings;
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].mistake, Mistake::StateCarriedWithGraph);
    assert_eq!(f[0].frame.as_ref().unwrap().line, 20);
    assert_eq!(f[0].bytes, 3 * MIB);
    assert!(f[0].fix.contains("detach()"));
}
