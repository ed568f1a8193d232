//! The training loop the doctor's tests diagnose, shared by the `doctor_*` files: written out
//! event by event as a PyTorch snapshot of the loop below would record them (Python frames,
//! innermost first; the autograd engine's thread records none), with every byte figure derived
//! by hand in the comments:
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
use headroom_memory::doctor::{Diagnosis, DoctorOptions, SourceLines, diagnose, read_trace};
use serde_json::{Value, json};

pub(crate) const MIB: u64 = 1 << 20;

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Loop {
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

pub(crate) fn user(line: i64) -> Value {
    json!({"filename": "train.py", "line": line, "name": "main"})
}

pub(crate) fn lib(file: &str, name: &str) -> Value {
    json!({"filename": format!("/usr/lib/python3/site-packages/torch/{file}"), "line": 1, "name": name})
}

/// The doctor's options of these tests: the default allocator, five call sites.
pub(crate) fn options<'a>(capacity: Option<u64>, source: SourceLines<'a>) -> DoctorOptions<'a> {
    DoctorOptions {
        capacity,
        allocator: AllocatorConfig::default(),
        sites: 5,
        source,
    }
}

pub(crate) struct Writer {
    pub(crate) events: Vec<Value>,
    pub(crate) next: u64,
    /// Stated phases and categories, as the tracer writes them.
    pub(crate) stated: bool,
}

impl Writer {
    pub(crate) fn new(stated: bool) -> Writer {
        Writer {
            events: Vec::new(),
            next: 0,
            stated,
        }
    }

    pub(crate) fn alloc(
        &mut self,
        size: u64,
        frames: Vec<Value>,
        category: Category,
        phase: &str,
    ) -> u64 {
        self.next += 1;
        let mut e = json!({"action": "alloc", "addr": self.next, "size": size, "frames": frames});
        if self.stated {
            e["category"] = json!(category.name());
            e["phase"] = json!(phase);
        }
        self.events.push(e);
        self.next
    }

    pub(crate) fn free(&mut self, addr: u64, frames: Vec<Value>) {
        self.events
            .push(json!({"action": "free", "addr": addr, "frames": frames}));
    }
}

/// The loop's trace over `steps` steps.
pub(crate) fn trace(mistake: Loop, steps: usize, stated: bool) -> Vec<u8> {
    use Category::*;
    let mut w = Writer::new(stated);
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

pub(crate) fn diagnosis(
    mistake: Loop,
    steps: usize,
    stated: bool,
    capacity: Option<u64>,
) -> Diagnosis {
    let events = read_trace(&trace(mistake, steps, stated)).unwrap();
    let source = source(mistake);
    diagnose(&events, &options(capacity, &source))
}
