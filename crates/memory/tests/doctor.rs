//! The doctor on training loops written out event by event, as a PyTorch snapshot of the loop
//! below would record them (Python frames, innermost first; the autograd engine's thread records
//! none), with every byte figure derived by hand in the comments:
//!
//! ```text
//! train.py:10  model = Model().cuda()            # parameters: 4 MiB + 1 MiB
//! train.py:20  logits = model(x)                 # activation 2 MiB (linear.py), a 1 MiB temporary, logits 3 MiB
//! train.py:21  loss = F.cross_entropy(logits, y) # a scalar: one 512-byte block
//! train.py:22  <the mistake's line, or a comment>
//! train.py:23  loss.backward()                   # gradients 4 + 1 MiB, a 1 MiB temporary, frees the activation
//! train.py:24  opt.step()                        # AdamW: states 2 × 5 MiB made at the first step, a 5 MiB foreach temporary
//! train.py:25  opt.zero_grad()                   # frees the gradients (set_to_none=True)
//! ```
//!
//! Assigning the next step's `logits` and `loss` frees the previous ones.

use headroom_memory::AllocatorConfig;
use headroom_memory::category::Category;
use headroom_memory::doctor::{Diagnosis, DoctorOptions, Mistake, Phase, diagnose, read_trace};
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;

#[derive(Clone, Copy, PartialEq)]
enum Loop {
    Correct,
    LossSummed,
    OutputsInList,
    NoZeroGrad,
    /// `losses.append(loss)`: a scalar kept in a list.
    LossInList,
    /// `outputs.append(logits)` where the logits come from the user's own `forward`
    /// (model.py:5), so the innermost user frame is the model's, not the loop's.
    OutputsInListUserModel,
    /// `h = cell(x, h)` at line 20: the output fed back in, kept by the next step's graph.
    StateCarried,
}

impl Loop {
    fn keeps_logits(self) -> bool {
        matches!(
            self,
            Loop::OutputsInList | Loop::OutputsInListUserModel | Loop::StateCarried
        )
    }

    fn keeps_loss(self) -> bool {
        matches!(self, Loop::LossSummed | Loop::LossInList)
    }
}

fn line(mistake: Loop) -> &'static str {
    match mistake {
        Loop::LossSummed => "    total_loss += loss",
        Loop::OutputsInList | Loop::OutputsInListUserModel => "    outputs.append(logits)",
        Loop::LossInList => "    losses.append(loss)",
        _ => "    # nothing kept",
    }
}

/// The script's lines, as the doctor reads them where the file is at hand.
fn source(mistake: Loop) -> impl Fn(&str, i64) -> Option<String> {
    move |file, n| {
        let text = match (file, n) {
            ("train.py", 10) => "model = Model().cuda()",
            ("train.py", 20) if mistake == Loop::StateCarried => "    h = cell(x, h)  # state",
            ("train.py", 20) => "    logits = model(x)",
            ("model.py", 5) => "        return self.head(x)",
            ("train.py", 21) => "    loss = F.cross_entropy(logits, y)",
            ("train.py", 22) => line(mistake),
            ("train.py", 23) => "    loss.backward()",
            ("train.py", 24) => "    opt.step()",
            ("train.py", 25) if mistake != Loop::NoZeroGrad => "    opt.zero_grad()",
            ("train.py", 25) => "    # (no zero_grad)",
            ("train.py", 26..=40) => "",
            _ => return None,
        };
        Some(text.to_string())
    }
}

fn user(line: i64) -> Value {
    json!({"filename": "train.py", "line": line, "name": "main"})
}

fn lib(file: &str, name: &str) -> Value {
    json!({"filename": format!("/usr/lib/python3/site-packages/torch/{file}"), "line": 1, "name": name})
}

struct Writer {
    events: Vec<Value>,
    next: u64,
    /// Stated phases and categories, as the tracer writes them.
    stated: bool,
}

impl Writer {
    fn alloc(&mut self, size: u64, frames: Vec<Value>, category: Category, phase: &str) -> u64 {
        self.next += 1;
        let mut e = json!({"action": "alloc", "addr": self.next, "size": size, "frames": frames});
        if self.stated {
            e["category"] = json!(category.name());
            e["phase"] = json!(phase);
        }
        self.events.push(e);
        self.next
    }

    fn free(&mut self, addr: u64, frames: Vec<Value>) {
        self.events
            .push(json!({"action": "free", "addr": addr, "frames": frames}));
    }
}

/// The loop's trace over `steps` steps.
fn trace(mistake: Loop, steps: usize, stated: bool) -> Vec<u8> {
    use Category::*;
    let mut w = Writer {
        events: Vec::new(),
        next: 0,
        stated,
    };
    let setup = || vec![lib("nn/modules/module.py", "cuda"), user(10)];
    let fwd = || {
        let mut frames = vec![lib("nn/modules/linear.py", "forward")];
        if mistake == Loop::OutputsInListUserModel {
            frames.push(json!({"filename": "model.py", "line": 5, "name": "forward"}));
        }
        frames.push(user(20));
        frames
    };
    let loss_frames = || vec![lib("nn/functional.py", "cross_entropy"), user(21)];
    let opt = || vec![lib("optim/adamw.py", "_multi_tensor_adamw"), user(24)];
    let zero = || vec![lib("optim/optimizer.py", "zero_grad"), user(25)];
    w.alloc(4 * MIB, setup(), Parameter, "forward");
    w.alloc(MIB, setup(), Parameter, "forward");
    let (mut logits, mut loss): (Option<u64>, Option<u64>) = (None, None);
    let mut grads: Option<[u64; 2]> = None;
    for step in 0..steps {
        // Forward.
        let act = w.alloc(2 * MIB, fwd(), Activation, "forward");
        let tmp = w.alloc(MIB, fwd(), Temporary, "forward");
        w.free(tmp, fwd());
        let new_logits = w.alloc(3 * MIB, fwd(), Activation, "forward");
        if let Some(old) = logits.replace(new_logits)
            && !mistake.keeps_logits()
        {
            w.free(old, vec![user(20)]);
        }
        let new_loss = w.alloc(512, loss_frames(), Temporary, "forward");
        if let Some(old) = loss.replace(new_loss)
            && !mistake.keeps_loss()
        {
            w.free(old, vec![user(21)]);
        }
        // Backward: no Python frame on autograd's thread.
        if grads.is_none() {
            grads = Some([
                w.alloc(4 * MIB, vec![], Gradient, "backward"),
                w.alloc(MIB, vec![], Gradient, "backward"),
            ]);
        }
        let bt = w.alloc(MIB, vec![], Temporary, "backward");
        w.free(bt, vec![]);
        w.free(act, vec![]);
        // Optimizer step.
        if step == 0 {
            w.alloc(4 * MIB, opt(), OptimizerState, "optimizer");
            w.alloc(4 * MIB, opt(), OptimizerState, "optimizer");
            w.alloc(MIB, opt(), OptimizerState, "optimizer");
            w.alloc(MIB, opt(), OptimizerState, "optimizer");
        }
        let ot = w.alloc(5 * MIB, opt(), Temporary, "optimizer");
        w.free(ot, opt());
        // zero_grad(set_to_none=True) frees the gradients.
        if mistake != Loop::NoZeroGrad {
            for g in grads.take().unwrap() {
                w.free(g, zero());
            }
            if stated {
                w.events
                    .push(json!({"action": "mark", "phase": "zero_grad"}));
            }
        }
    }
    serde_json::to_vec(&w.events).unwrap()
}

fn diagnosis(mistake: Loop, steps: usize, stated: bool, capacity: Option<u64>) -> Diagnosis {
    let events = read_trace(&trace(mistake, steps, stated)).unwrap();
    let source = source(mistake);
    diagnose(
        &events,
        &DoctorOptions {
            capacity,
            allocator: AllocatorConfig::default(),
            sites: 5,
            source: &source,
        },
    )
}

#[test]
fn the_peak_is_the_first_optimizer_step_attributed_by_lifetime() {
    // At the first step's foreach temporary: parameters 5 MiB, gradients 5, states 10, and
    // temporaries 5 (foreach) + 3 (logits, kept until the next forward) + 512 bytes (the loss).
    // The second step reaches the same 28 MiB + 512 bytes; the first is reported.
    let d = diagnosis(Loop::Correct, 4, false, None);
    let peak = d.peak.unwrap();
    assert_eq!(peak.allocated_bytes, 28 * MIB + 512);
    assert_eq!(peak.phase, Some(Phase::Optimizer));
    assert_eq!(peak.step, 0);
    let cat = |c: Category| peak.by_category.iter().find(|(k, _)| *k == c).unwrap().1;
    assert_eq!(cat(Category::Parameter), 5 * MIB);
    assert_eq!(cat(Category::Gradient), 5 * MIB);
    assert_eq!(cat(Category::OptimizerState), 10 * MIB);
    assert_eq!(cat(Category::Temporary), 8 * MIB + 512);
    assert_eq!(cat(Category::Activation), 0);
    // Sites: opt.step() holds the states and the temporary (15 MiB in 5 blocks), then the
    // parameters at line 10 and the gradients with no Python frame (5 MiB each).
    let top = &peak.sites[0];
    assert_eq!(top.frame.as_ref().unwrap().line, 24);
    assert_eq!((top.bytes, top.count), (15 * MIB, 5));
    assert_eq!(top.innermost.as_ref().unwrap().name, "_multi_tensor_adamw");
    let sizes: Vec<u64> = peak.sites.iter().map(|s| s.bytes).collect();
    assert_eq!(sizes, [15 * MIB, 5 * MIB, 5 * MIB, 3 * MIB, 512]);
    assert_eq!(d.steps, 4);
}

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
    let d = diagnose(
        &events,
        &DoctorOptions {
            capacity: None,
            allocator: AllocatorConfig::default(),
            sites: 5,
            source: &none,
        },
    );
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
fn a_fragmentation_bound_oom_is_avoided_by_expandable_segments_by_replay() {
    // Two 20 MiB shared large segments (requests of 1 to 10 MiB share one, PyTorch's
    // kLargeBuffer) fill a 40 MiB device: each holds three 6 MiB blocks; freeing the first and
    // third leaves free 6 | live 6 | free 8 in each. A 9 MiB request finds no free block that
    // large, needs a third segment, and no segment is wholly free to release: out of memory
    // with 12 MiB allocated, though 12 + 9 ≤ 40. Expandable segments lay the six blocks end to
    // end in one range (pages of 20 MiB): the third and fourth blocks, freed, make one 12 MiB
    // hole (12..24 MiB) inside the two pages already mapped, and the request fits there.
    let mut events = Vec::new();
    for id in 1..=6u64 {
        events.push(json!({"action": "alloc", "addr": id, "size": 6 * MIB, "frames": [user(7)]}));
    }
    for id in [1u64, 3, 4, 6] {
        events.push(json!({"action": "free", "addr": id}));
    }
    // The failed request, made by a library op called from line 42: the OOM names line 42.
    events.push(json!({"action": "alloc", "addr": 7, "size": 9 * MIB,
        "frames": [lib("nn/functional.py", "linear"), user(42)]}));
    let events = read_trace(&serde_json::to_vec(&events).unwrap()).unwrap();
    let none = |_: &str, _: i64| None;
    let d = diagnose(
        &events,
        &DoctorOptions {
            capacity: Some(40 * MIB),
            allocator: AllocatorConfig::default(),
            sites: 5,
            source: &none,
        },
    );
    let oom = d.fragmentation.caching.first_oom.clone().unwrap();
    assert_eq!(oom.event_index, 10);
    assert_eq!(oom.requested_bytes, 9 * MIB);
    assert_eq!(oom.allocated_bytes, 12 * MIB);
    assert_eq!(oom.reserved_bytes, 40 * MIB);
    assert_eq!(oom.largest_free_block_bytes, 8 * MIB);
    assert!(oom.fragmentation_bound);
    let at = oom.frame.expect("the failed request's call site");
    assert_eq!((at.filename.as_str(), at.line), ("train.py", 42));
    assert_eq!(d.fragmentation.expandable.first_oom, None);
    // Emptying the cache releases whole free segments only: both are split, so it fails too.
    let emptied = d.fragmentation.emptied_before_failing_phase.unwrap();
    assert!(emptied.first_oom.is_some());
}

#[test]
fn with_room_for_the_peak_nothing_fails_and_reserved_covers_allocated() {
    let d = diagnosis(Loop::Correct, 3, false, Some(64 * MIB));
    assert_eq!(d.fragmentation.caching.ooms, 0);
    assert_eq!(d.fragmentation.caching.peak_allocated_bytes, 28 * MIB + 512);
    assert!(d.fragmentation.caching.peak_reserved_bytes >= 28 * MIB + 512);
}

#[test]
fn bad_traces_name_the_event() {
    for (text, needle) in [
        (
            r#"[{"action":"alloc","addr":1}]"#,
            "event 0: an alloc needs \"size\"",
        ),
        (r#"[{"action":"grow","addr":1}]"#, "unknown action"),
        (
            r#"[{"action":"alloc","addr":1,"size":8,"category":"weights"}]"#,
            "unknown memory category",
        ),
        (r#"[{"action":"alloc","addr":1,"size":8}"#, "ends early"),
    ] {
        let e = read_trace(text.as_bytes()).unwrap_err().to_string();
        assert!(e.contains(needle), "{text}: {e}");
    }
}

#[test]
fn evaluation_that_saves_tensors_for_backward_is_named() {
    // As the tracer states it: two evaluation batches at train.py:31, each saving a 2 MiB
    // activation (a forward outside torch.no_grad) freed when its output goes.
    let mut w = Writer {
        events: Vec::new(),
        next: 0,
        stated: true,
    };
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
    let d = diagnose(
        &events,
        &DoctorOptions {
            capacity: None,
            allocator: AllocatorConfig::default(),
            sites: 5,
            source: &none,
        },
    );
    let f = &d.leaks.findings;
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].mistake, Mistake::EvaluationBuildsGraph);
    assert_eq!(f[0].frame.as_ref().unwrap().line, 31);
    assert_eq!(f[0].bytes, 4 * MIB);
    assert!(f[0].fix.contains("torch.no_grad()"));
}

#[test]
fn a_pytorch_snapshot_pickle_is_read_with_its_frames() {
    use serde_pickle::{HashableValue as K, Value as V};
    use std::collections::BTreeMap;
    let frame = |file: &str, line: i64, name: &str| {
        let mut f = BTreeMap::new();
        f.insert(K::String("filename".into()), V::String(file.into()));
        f.insert(K::String("line".into()), V::I64(line));
        f.insert(K::String("name".into()), V::String(name.into()));
        V::Dict(f)
    };
    let entry = |action: &str, addr: i64, size: i64, frames: Vec<V>| {
        let mut e = BTreeMap::new();
        e.insert(K::String("action".into()), V::String(action.into()));
        e.insert(K::String("addr".into()), V::I64(addr));
        e.insert(K::String("size".into()), V::I64(size));
        e.insert(K::String("frames".into()), V::List(frames));
        V::Dict(e)
    };
    let at20 = || {
        vec![
            frame(
                "/x/site-packages/torch/nn/modules/linear.py",
                125,
                "forward",
            ),
            frame("train.py", 20, "main"),
        ]
    };
    let trace = vec![
        entry("segment_alloc", 100, 2 * MIB as i64, vec![]),
        entry("alloc", 100, 1024, at20()),
        entry("alloc", 200, 512, at20()),
        // PyTorch records a free twice: requested, then completed.
        entry("free_requested", 100, 1024, at20()),
        entry("free_completed", 100, 1024, at20()),
    ];
    let mut top = BTreeMap::new();
    top.insert(K::String("segments".into()), V::List(vec![]));
    top.insert(
        K::String("device_traces".into()),
        V::List(vec![V::List(trace)]),
    );
    let bytes = serde_pickle::value_to_vec(&V::Dict(top), serde_pickle::SerOptions::new()).unwrap();
    let events = read_trace(&bytes).unwrap();
    // Two allocs and one free; the segment event and the free request change no tensor.
    assert_eq!(events.events.len(), 3);
    // Both allocs share one interned stack of two frames.
    assert_eq!(events.events[0].stack, events.events[1].stack);
    let frames: Vec<_> = events.stack(events.events[0].stack).collect();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[1].line, 20);
    let none = |_: &str, _: i64| None;
    let d = diagnose(
        &events,
        &DoctorOptions {
            capacity: None,
            allocator: AllocatorConfig::default(),
            sites: 5,
            source: &none,
        },
    );
    let peak = d.peak.unwrap();
    assert_eq!(peak.allocated_bytes, 1024 + 512);
    assert_eq!(peak.sites[0].frame.as_ref().unwrap().line, 20);
    assert_eq!(peak.sites[0].count, 2);
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

#[test]
fn the_replay_reads_a_trace_with_phase_marks_and_frames() {
    // What `headroom.tracing` writes: frames on allocations and a zero_grad mark with no
    // address. The replay keeps the two allocations and the free; the mark changes no bytes.
    let text = r#"[
        {"action":"alloc","addr":1,"size":1024,"phase":"forward","step":0,"frames":[{"filename":"train.py","line":20,"name":"main"}]},
        {"action":"alloc","addr":2,"size":512,"phase":"backward","step":0},
        {"action":"mark","phase":"zero_grad","step":0},
        {"action":"free","addr":2,"phase":"zero_grad","step":0}
    ]"#;
    let trace = headroom_memory::replay::parse_trace(text.as_bytes()).unwrap();
    assert_eq!(trace.events.len(), 3);
}
