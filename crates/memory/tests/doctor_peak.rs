//! The doctor's peak on the training loop of `doctor_support`: the moment it reports and what
//! holds the bytes there, by category and by call site.

use crate::doctor_support::{Loop, MIB, diagnosis};
use headroom_memory::category::Category;
use headroom_memory::doctor::Phase;

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
