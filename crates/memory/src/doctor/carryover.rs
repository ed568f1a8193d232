//! What the previous step still holds at the peak: tensors a loop's variable keeps from one step
//! into the next. `out = model(x)` releases the previous step's `out` only when the new forward
//! has returned, so the previous outputs (logits, a returned key/value cache) sit through the
//! forward's end, often the peak; `del out` once backward has run (or keeping `out.loss`, or
//! `loss.item()`, alone) frees them a whole forward earlier.
//!
//! Not for: what is never released (see `leaks`) or the model's and optimizer's own state.

use super::events::{Events, Frame};
use super::leaks::SourceLines;
use super::lifetimes::Lifetime;
use super::peak::{Peak, Site, is_library_frame, sites};
use super::phases::Timeline;
use serde::Serialize;

/// The previous step's tensors alive at the peak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Carryover {
    /// Their bytes at the peak.
    pub bytes: u64,
    /// The call sites that made them, largest first.
    pub sites: Vec<Site>,
    /// The user's frame that keeps the largest of them: the loop's line that called the model
    /// and whose variable holds its outputs (`out = model(x)`).
    pub kept_by: Option<Frame>,
    /// That line, where the file is at hand.
    pub code: Option<String>,
    pub fix: &'static str,
}

/// The share of the peak, and the bytes, below which what the previous step holds is not
/// reported: a scalar loss or a small model's logits kept in a variable until the next step
/// are no lever.
pub const MIN_SHARE: f64 = 0.01;
pub const MIN_BYTES: u64 = 1 << 20;

const FIX: &str = "delete the step's outputs once backward has run (`del out`, or keep `out.loss` or `loss.item()` alone): a variable assigned each step (`out = model(x)`) releases the previous step's tensors only when the next forward has returned, so they sit through its peak";

/// The user's frame that keeps what `stack` made: the frame that called the outermost
/// `forward` of the user's frames (a model's code returns its outputs to its caller, the loop's
/// `out = model(x)`); that `forward` itself where no user frame called it (a library's loop);
/// the innermost user frame where no `forward` is among them (the loop made it itself).
fn keeper(events: &Events, stack: u32) -> Option<Frame> {
    let user: Vec<&Frame> = events
        .stack(stack)
        .filter(|f| !is_library_frame(f))
        .collect();
    let at = match user.iter().rposition(|f| f.name == "forward") {
        Some(outermost) => outermost + 1,
        None => 0,
    };
    user.get(at).or(user.last()).map(|f| (*f).clone())
}

/// The allocations made in the step before the peak's, alive at the peak and released before
/// its step ends (what outlives it is a leak, `leaks`), but for state kept by design; `None`
/// where the peak is in the first step or they are under [`MIN_SHARE`] of it or [`MIN_BYTES`].
pub fn carryover(
    events: &Events,
    timeline: &Timeline,
    lifetimes: &[Lifetime],
    peak: &Peak,
    limit: usize,
    source: SourceLines<'_>,
) -> Option<Carryover> {
    let previous = peak.step.checked_sub(1)?;
    let step_end = timeline
        .step_starts
        .get(peak.step as usize)
        .copied()
        .unwrap_or(events.events.len());
    let held = || {
        lifetimes.iter().filter(move |l| {
            timeline.steps[l.alloc] == previous
                && l.alive_after(peak.event_index)
                && l.free.is_some_and(|f| f < step_end)
                && !l.kept_by_design()
        })
    };
    let bytes: u64 = held().map(|l| l.size).sum();
    if bytes < MIN_BYTES || (bytes as f64) < MIN_SHARE * peak.allocated_bytes as f64 {
        return None;
    }
    let largest = held().max_by_key(|l| l.size)?;
    let kept_by = keeper(events, largest.stack);
    let code = kept_by
        .as_ref()
        .and_then(|f| source(&f.filename, f.line))
        .map(|c| c.trim().to_string());
    Some(Carryover {
        bytes,
        sites: sites(events, held(), limit),
        kept_by,
        code,
        fix: FIX,
    })
}
