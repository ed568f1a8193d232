//! The doctor's replay of the trace through the allocators: an out-of-memory bound by
//! fragmentation under the caching allocator, avoided by expandable segments, and a device with
//! room for the peak where nothing fails.

use crate::doctor_support::{Loop, MIB, diagnosis, lib, options, user};
use headroom_memory::doctor::{diagnose, read_trace};
use serde_json::json;

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
    let d = diagnose(&events, &options(Some(40 * MIB), &none));
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
