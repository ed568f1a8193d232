//! What the previous step still holds at the peak, on a loop written event by event: each step
//! the user's model (model.py:5, its `forward`) makes an output that `out = model(x)`
//! (train.py:20) keeps until the next forward has returned. Byte figures by hand.

use crate::doctor_support::{MIB, Writer, lib, options, user};
use headroom_memory::category::Category;
use headroom_memory::doctor::{diagnose, read_trace};
use serde_json::json;

/// Four steps: parameters 1 MiB; each step an output of `out_bytes` (released after the next
/// one is made unless `released_early`, as `del out` after backward does), a backward and an
/// optimizer temporary of `temporary` bytes each.
fn trace(out_bytes: u64, temporary: u64, released_early: bool) -> Vec<u8> {
    use Category::*;
    let mut w = Writer::new(true);
    let model = || {
        vec![
            lib("nn/modules/linear.py", "forward"),
            json!({"filename": "model.py", "line": 5, "name": "forward"}),
            user(20),
        ]
    };
    w.alloc(MIB, vec![user(10)], Parameter, "forward");
    let mut out: Option<u64> = None;
    for _ in 0..4 {
        let new = w.alloc(out_bytes, model(), Activation, "forward");
        if let Some(old) = out.replace(new) {
            w.free(old, vec![user(20)]);
        }
        let t = w.alloc(temporary, vec![], Temporary, "backward");
        w.free(t, vec![]);
        if released_early {
            w.free(out.take().unwrap(), vec![user(22)]);
        }
        let o = w.alloc(temporary, vec![user(24)], Temporary, "optimizer");
        w.free(o, vec![user(24)]);
    }
    serde_json::to_vec(&w.events).unwrap()
}

fn source(file: &str, line: i64) -> Option<String> {
    match (file, line) {
        ("train.py", 20) => Some("    out = model(x)".into()),
        ("model.py", 5) => Some("        return self.head(x)".into()),
        _ => None,
    }
}

fn carryover(
    out_bytes: u64,
    temporary: u64,
    released_early: bool,
) -> Option<headroom_memory::doctor::Carryover> {
    let events = read_trace(&trace(out_bytes, temporary, released_early)).unwrap();
    let d = diagnose(&events, &options(None, &source));
    d.carryover
}

#[test]
fn the_previous_output_held_at_the_peak_is_named_with_the_line_that_keeps_it() {
    // The peak is the second step's output made beside the first's: 1 + 8 + 8 MiB. The first
    // step's 8 MiB, released within the second step, are what it still holds; the model's
    // forward made them, the loop's line that called it keeps them.
    let c = carryover(8 * MIB, MIB, false).expect("a carryover");
    assert_eq!(c.bytes, 8 * MIB);
    assert_eq!(c.sites.len(), 1);
    assert_eq!(c.sites[0].frame.as_ref().unwrap().filename, "model.py");
    let kept = c.kept_by.unwrap();
    assert_eq!((kept.filename.as_str(), kept.line), ("train.py", 20));
    assert_eq!(c.code.as_deref(), Some("out = model(x)"));
    assert!(c.fix.contains("del out"));
}

#[test]
fn an_output_deleted_after_backward_or_too_small_is_not_reported() {
    // `del out` after backward: nothing of the previous step is live at the peak. With 4 KiB
    // temporaries an output of 512 KiB still peaks beside the previous one (1 + 0.5 + 0.5 MiB),
    // but is under the 1 MiB floor, though 25 % of the peak; at 2 MiB it is reported.
    assert_eq!(carryover(8 * MIB, MIB, true), None);
    assert_eq!(carryover(MIB / 2, 4096, false), None);
    assert_eq!(
        carryover(2 * MIB, 4096, false).map(|c| c.bytes),
        Some(2 * MIB)
    );
}
