//! Leaks and retention: memory that grows step over step, the call sites whose allocations
//! outlive the step that made them, and the mistake each looks like — a loss summed with its
//! graph, outputs kept in a list, evaluation that records a graph, gradients never cleared —
//! each with its one-line fix (PyTorch FAQ, "My model reports cuda runtime error(2): out of
//! memory": don't accumulate history across the training loop; `torch.no_grad` for
//! evaluation; `Optimizer.zero_grad(set_to_none=True)`).
//!
//! Not for: the peak (see `peak`) or fragmentation (see `fragmentation`).

use super::events::{Events, Frame, Phase};
use super::lifetimes::Lifetime;
use super::peak::{call_site, is_library_frame};
use super::phases::Timeline;
use crate::category::Category;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// The mistake a finding looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mistake {
    /// A running sum of losses that keeps each step's graph (`total += loss`).
    LossKeptWithGraph,
    /// Outputs appended to a list with their graph.
    OutputsKeptInList,
    /// Tensors made in a step outlive it for a reason the line does not show.
    RetainedAcrossSteps,
    /// Evaluation without `torch.no_grad()`: its forward saves tensors for a backward that never
    /// comes.
    EvaluationBuildsGraph,
    /// Gradients persist and are never cleared.
    GradientsNeverCleared,
    /// A state carried from step to step without `detach()` (`h = cell(x, h)`): every step's
    /// graph stays reachable from it, its saved tensors with it.
    StateCarriedWithGraph,
}

impl Mistake {
    pub fn fix(self) -> &'static str {
        match self {
            Mistake::LossKeptWithGraph => {
                "keep `loss.item()` (or `loss.detach()`), not the loss tensor: a running sum or a list of them keeps every step's graph alive"
            }
            Mistake::OutputsKeptInList => {
                "append `output.detach()` (or `.cpu()`, `.item()`) instead of the output itself: the list keeps each step's graph alive"
            }
            Mistake::RetainedAcrossSteps => {
                "something keeps these tensors after their step (a list, a dict, an attribute, a running sum): keep detached copies or Python numbers"
            }
            Mistake::EvaluationBuildsGraph => {
                "wrap evaluation in `with torch.no_grad():` (or `torch.inference_mode()`) and call `model.eval()`: without it every forward saves tensors for a backward that never runs"
            }
            Mistake::StateCarriedWithGraph => {
                "detach the state before the next step (`h = cell(x, h.detach())`, truncated backpropagation through time) and drop `retain_graph=True`: otherwise each step's graph stays reachable from it"
            }
            Mistake::GradientsNeverCleared => {
                "call `optimizer.zero_grad()` every step (set_to_none=True, the default, also frees them between steps): without it gradients add up across steps"
            }
        }
    }
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub mistake: Mistake,
    /// The user's frame the tensors come from.
    pub frame: Option<Frame>,
    /// The source line, where the file could be read.
    pub code: Option<String>,
    /// The line that keeps the tensors (a `.append`, a `+=` of the variable the site assigns),
    /// where the file shows one.
    pub kept_at: Option<(i64, String)>,
    /// Bytes the finding holds: per step for retention, at most at once for evaluation.
    pub bytes: u64,
    /// In how many steps the pattern was seen.
    pub steps: usize,
    pub fix: &'static str,
}

/// What the leak check found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Leaks {
    /// Allocated bytes at the end of each step.
    pub bytes_at_step_end: Vec<u64>,
    /// Bytes added per step where allocated bytes grow at every step end after the first.
    pub growth_per_step: Option<u64>,
    pub findings: Vec<Finding>,
    /// Why a check could not be made (too few steps).
    pub unchecked: Option<String>,
}

/// The allocations of one call site kept past the step after theirs.
struct Retained {
    bytes: u64,
    steps: BTreeSet<u32>,
    phase: Option<Phase>,
    largest: u64,
    /// The stack of the largest allocation.
    stack: u32,
}

/// Reads a source line (file, 1-based line) where the file is at hand.
pub type SourceLines<'a> = &'a dyn Fn(&str, i64) -> Option<String>;

/// The index of the last event of each step.
fn step_ends(timeline: &Timeline, len: usize) -> Vec<usize> {
    let mut ends: Vec<usize> = timeline.step_starts.iter().map(|&s| s - 1).collect();
    if len > 0 {
        ends.push(len - 1);
    }
    ends
}

/// How far below an allocating line the retainer is looked for.
const RETAINER_WINDOW: i64 = 30;

/// The variable a line assigns (`logits = model(x)` → `logits`).
fn assigned_variable(code: &str) -> Option<&str> {
    let (lhs, rhs) = code.split_once('=')?;
    if rhs.starts_with('=') || lhs.ends_with(['!', '<', '>', '+', '-', '*', '/']) {
        return None;
    }
    let name = lhs.trim();
    (!name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_')).then_some(name)
}

/// Whether `code` names `var` as a whole identifier not followed by a `.` (`h` in
/// `cell(x, h)`, not in `h.detach()` or `hh`).
fn uses_bare(code: &str, var: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices(var).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + var.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(|c| ident(c) || c == '.')
    })
}

/// Whether a line feeds a variable it assigns back into what computes it (`h = cell(x, h)`,
/// `out, h = rnn(x, h)`): a state carried from step to step with its graph.
fn carries_state(code: &str) -> bool {
    let Some((lhs, rhs)) = code.split_once('=') else {
        return false;
    };
    if rhs.starts_with('=') || lhs.ends_with(['!', '<', '>', '+', '-', '*', '/']) {
        return false;
    }
    let rhs = rhs.split('#').next().unwrap_or("");
    lhs.split(',').map(str::trim).any(|name| {
        !name.is_empty()
            && name.chars().all(|c| c.is_alphanumeric() || c == '_')
            && uses_bare(rhs, name)
    })
}

/// The line below `frame` that keeps what it assigns: appended to a list or summed. A scalar
/// (at most `largest` bytes ≤ one smallest block) kept in a list is a loss or metric.
fn find_retainer(
    source: SourceLines<'_>,
    frame: &Frame,
    code: &str,
    largest: u64,
) -> Option<(i64, String, Mistake)> {
    let var = assigned_variable(code)?;
    for line in frame.line + 1..=frame.line + RETAINER_WINDOW {
        let Some(text) = source(&frame.filename, line) else {
            break;
        };
        let compact = text.replace(' ', "");
        let kept_in_list = [".append(", ".extend([", ".insert("].iter().any(|k| {
            compact.contains(&format!("{k}{var})")) || compact.contains(&format!("{k}{var}."))
        });
        let summed =
            compact.contains(&format!("+={var}")) && !compact.contains(&format!("+={var}."));
        if kept_in_list {
            let mistake = if largest <= SCALAR_BLOCK {
                Mistake::LossKeptWithGraph
            } else {
                Mistake::OutputsKeptInList
            };
            return Some((line, text.trim().to_string(), mistake));
        }
        if summed {
            return Some((line, text.trim().to_string(), Mistake::LossKeptWithGraph));
        }
    }
    None
}

/// The smallest block PyTorch's allocator hands out: a scalar tensor takes one.
const SCALAR_BLOCK: u64 = 512;

/// The mistake a site's retained allocations look like: from the code line where the file is at
/// hand, else from their sizes (a scalar per step is a loss or metric kept as a tensor).
fn classify(code: Option<&str>, phase: Option<Phase>, largest: u64) -> Mistake {
    let code = code.unwrap_or("").replace(' ', "");
    if [".append(", ".extend(", ".insert(", "+=["]
        .iter()
        .any(|k| code.contains(k))
    {
        Mistake::OutputsKeptInList
    } else if code.contains("+=") || code.contains("sum(") || largest <= SCALAR_BLOCK {
        Mistake::LossKeptWithGraph
    } else if phase == Some(Phase::Evaluation) {
        Mistake::EvaluationBuildsGraph
    } else {
        Mistake::RetainedAcrossSteps
    }
}

pub fn leaks(
    events: &Events,
    timeline: &Timeline,
    lifetimes: &[Lifetime],
    curve: &[u64],
    source: SourceLines<'_>,
) -> Leaks {
    let ends = step_ends(timeline, events.events.len());
    let bytes_at_step_end: Vec<u64> = ends.iter().map(|&e| curve[e]).collect();
    let mut findings = Vec::new();
    let frame_code = |frame: Option<u32>| {
        let f = frame.map(|f| events.frames[f as usize].clone());
        let code = f
            .as_ref()
            .and_then(|f| source(&f.filename, f.line))
            .map(|c| c.trim().to_string());
        (f, code)
    };

    // Evaluation that saves tensors for backward (the trace states activations).
    let mut eval_sites: HashMap<Option<u32>, (u64, BTreeSet<u32>)> = HashMap::new();
    for l in lifetimes.iter().filter(|l| {
        l.stated
            && l.category == Category::Activation
            && timeline.phases[l.alloc] == Some(Phase::Evaluation)
    }) {
        let e = eval_sites
            .entry(call_site(events, l.stack))
            .or_insert((0, BTreeSet::new()));
        e.0 += l.size;
        e.1.insert(timeline.steps[l.alloc]);
    }
    if !eval_sites.is_empty() {
        // One finding for the evaluation, at its largest site.
        let (frame, (_, steps)) = eval_sites
            .iter()
            .max_by_key(|(_, (b, _))| *b)
            .map(|(f, v)| (*f, v.clone()))
            .unwrap();
        let bytes = eval_sites.values().map(|(b, _)| b).sum();
        let (frame, code) = frame_code(frame);
        findings.push(Finding {
            mistake: Mistake::EvaluationBuildsGraph,
            frame,
            code,
            kept_at: None,
            bytes,
            steps: steps.len(),
            fix: Mistake::EvaluationBuildsGraph.fix(),
        });
    }

    if ends.len() < 3 {
        return Leaks {
            bytes_at_step_end,
            growth_per_step: None,
            findings,
            unchecked: Some(format!(
                "leaks need at least 3 training steps in the trace; it has {}",
                ends.len()
            )),
        };
    }
    let grows = bytes_at_step_end.windows(2).skip(1).all(|w| w[1] > w[0]);
    let growth_per_step = grows.then(|| {
        let n = bytes_at_step_end.len();
        (bytes_at_step_end[n - 1] - bytes_at_step_end[1]) / (n as u64 - 2)
    });

    // Allocations that outlive the step after the one that made them, but for what lives
    // across steps by design (`Lifetime::kept_by_design`).
    let mut retained: HashMap<Option<u32>, Retained> = HashMap::new();
    for l in lifetimes.iter().filter(|l| !l.kept_by_design()) {
        let step = timeline.steps[l.alloc] as usize;
        let Some(&next_end) = ends.get(step + 1) else {
            continue;
        };
        if l.alive_after(next_end) {
            let e = retained
                .entry(call_site(events, l.stack))
                .or_insert_with(|| Retained {
                    bytes: 0,
                    steps: BTreeSet::new(),
                    phase: timeline.phases[l.alloc],
                    largest: 0,
                    stack: l.stack,
                });
            e.bytes += l.size;
            e.steps.insert(step as u32);
            if l.size > e.largest {
                e.largest = l.size;
                e.stack = l.stack;
            }
        }
    }
    let mut sites: Vec<_> = retained
        .into_iter()
        .filter(|(_, r)| r.steps.len() >= 2)
        .collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.1.bytes));
    for (frame, r) in sites {
        let Retained {
            bytes,
            steps,
            phase,
            largest,
            stack,
        } = r;
        let (mut frame, mut code) = frame_code(frame);
        // The user's frames from the innermost out: a model's own `forward` made the tensor,
        // the loop that called it keeps it; the first frame whose lines show the keeping wins.
        let mut kept = None;
        let mut carried = false;
        for &id in &events.stacks[stack as usize] {
            if is_library_frame(&events.frames[id as usize]) {
                continue;
            }
            let (f, c) = frame_code(Some(id));
            let (Some(f), Some(c)) = (f, c) else {
                continue;
            };
            if let Some(k) = find_retainer(source, &f, &c, largest) {
                (frame, code, kept) = (Some(f), Some(c), Some(k));
                break;
            }
            if carries_state(&c) {
                (frame, code, carried) = (Some(f), Some(c), true);
                break;
            }
        }
        let mistake = match &kept {
            Some((_, _, m)) => *m,
            None if carried => Mistake::StateCarriedWithGraph,
            None => classify(code.as_deref(), phase, largest),
        };
        if mistake == Mistake::EvaluationBuildsGraph
            && findings.iter().any(|f| f.mistake == mistake)
        {
            continue;
        }
        findings.push(Finding {
            mistake,
            frame,
            code,
            kept_at: kept.map(|(line, text, _)| (line, text)),
            bytes: bytes / steps.len() as u64,
            steps: steps.len(),
            fix: mistake.fix(),
        });
    }

    // Gradients alive across every step boundary with no zero_grad anywhere. Only where the
    // trace states its phases: a PyTorch snapshot shows no event for a zero_grad that zeroes
    // in place (set_to_none=False), so its absence there proves nothing.
    let cleared = timeline.phases.contains(&Some(Phase::ZeroGrad));
    if timeline.stated && !cleared {
        let kept: Vec<&Lifetime> = lifetimes
            .iter()
            .filter(|l| {
                l.category == Category::Gradient
                    && ends[..ends.len() - 1]
                        .iter()
                        .all(|&e| e < l.alloc || l.alive_after(e))
                    && l.alive_after(ends[1])
            })
            .collect();
        if !kept.is_empty() {
            let site = kept.iter().max_by_key(|l| l.size).unwrap();
            let (frame, code) = frame_code(call_site(events, site.stack));
            findings.push(Finding {
                mistake: Mistake::GradientsNeverCleared,
                frame,
                code,
                kept_at: None,
                bytes: kept.iter().map(|l| l.size).sum(),
                steps: ends.len(),
                fix: Mistake::GradientsNeverCleared.fix(),
            });
        }
    }
    Leaks {
        bytes_at_step_end,
        growth_per_step,
        findings,
        unchecked: None,
    }
}
