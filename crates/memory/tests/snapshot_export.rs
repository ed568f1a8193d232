//! Snapshots we write are PyTorch snapshots: Python's `pickle` reads them with PyTorch's keys,
//! states and action names, and our own replay reads them back to the same allocator state.

use headroom_memory::replay::{ReplayEvent, Trace, TraceFormat, parse_trace, replay};
use headroom_memory::size::MIB;
use headroom_memory::{AllocatorConfig, CachingAllocator, Category, Snapshot, VirtualSource};
use std::process::Command;

fn recorded_run(config: AllocatorConfig) -> CachingAllocator {
    let mut a = CachingAllocator::new(1 << 34, config, Box::new(VirtualSource::default()));
    a.trace_mut().record_history(true, usize::MAX);
    a.trace_mut().set_step(3);
    a.trace_mut().set_phase("forward");
    let w = a
        .malloc(12 * MIB, Category::Parameter, Some("block0.fc1.weight"))
        .unwrap();
    let h = a
        .malloc(5 * MIB, Category::Activation, Some("block0.fc1.out"))
        .unwrap();
    let t = a.malloc(4000, Category::Temporary, None).unwrap();
    a.trace_mut().set_phase("backward");
    a.free(h.addr).unwrap();
    a.free(t.addr).unwrap();
    let _ = w;
    a
}

#[test]
fn python_pickle_reads_pytorch_keys_from_our_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snapshot.pickle");
    Snapshot::capture(&recorded_run(AllocatorConfig::default()))
        .write_pickle(&path)
        .unwrap();
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok());
    let Some(python) = python else {
        // Skipped: no Python interpreter on this machine, so there is no independent reader of
        // the pickle format to check against. The Rust-side round trip below still runs.
        eprintln!("skipped: python3 not found");
        return;
    };
    let script = r#"
import pickle, sys
s = pickle.load(open(sys.argv[1], 'rb'))
assert set(['segments', 'device_traces']) <= set(s), s.keys()
seg_keys = {'device', 'address', 'total_size', 'allocated_size', 'active_size', 'requested_size',
            'stream', 'segment_type', 'segment_pool_id', 'is_expandable', 'frames', 'blocks'}
for seg in s['segments']:
    assert seg_keys <= set(seg), set(seg) ^ seg_keys
    assert seg['segment_type'] in ('small', 'large')
    assert isinstance(seg['segment_pool_id'], tuple) and len(seg['segment_pool_id']) == 2
    assert sum(b['size'] for b in seg['blocks']) == seg['total_size']
    for b in seg['blocks']:
        assert {'address', 'size', 'requested_size', 'state', 'frames'} <= set(b)
        assert b['state'] in ('active_allocated', 'active_pending_free', 'inactive')
trace = s['device_traces'][0]
actions = [e['action'] for e in trace]
allowed = {'alloc', 'free_requested', 'free_completed', 'segment_alloc', 'segment_free',
           'segment_map', 'segment_unmap', 'oom', 'snapshot'}
assert set(actions) <= allowed, actions
for e in trace:
    assert {'action', 'size', 'stream', 'time_us', 'frames'} <= set(e)
    assert ('device_free' in e) if e['action'] == 'oom' else ('addr' in e)
# 12 MiB weight (12 MiB segment), 5 MiB activation (20 MiB segment), 4000 B temporary (2 MiB).
assert sorted(seg['total_size'] for seg in s['segments']) == [2 << 20, 12 << 20, 20 << 20]
live = [b for seg in s['segments'] for b in seg['blocks'] if b['state'] == 'active_allocated']
assert len(live) == 1 and live[0]['frames'][0]['name'].startswith('parameter:block0.fc1.weight')
assert actions.count('alloc') == 3 and actions.count('free_completed') == 2
assert actions.count('segment_alloc') == 3
print('ok')
"#;
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python check failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

#[test]
fn our_snapshot_replays_to_the_same_allocations() {
    for config in [AllocatorConfig::default(), AllocatorConfig::expandable()] {
        let original = recorded_run(config.clone());
        let snapshot = Snapshot::capture(&original);
        let trace = parse_trace(&snapshot.to_pickle()).unwrap();
        assert_eq!(trace.format, TraceFormat::PytorchSnapshot);
        // The JSON form carries the same events, categories included.
        let json = parse_trace(&serde_json::to_vec(&snapshot).unwrap()).unwrap();
        assert_eq!(
            json.events,
            trace
                .events
                .iter()
                .map(|e| match *e {
                    ReplayEvent::Alloc { id, size, .. } => ReplayEvent::Alloc {
                        id,
                        size,
                        category: json_category(&json, id)
                    },
                    other => other,
                })
                .collect::<Vec<_>>()
        );
        assert!(json.events.iter().any(|e| matches!(
            e,
            ReplayEvent::Alloc {
                category: Category::Parameter,
                ..
            }
        )));
        let mut again = CachingAllocator::new(1 << 34, config, Box::new(VirtualSource::default()));
        let outcome = replay(&trace, &mut again);
        assert_eq!(
            (outcome.allocs, outcome.frees, outcome.ooms.len()),
            (3, 2, 0)
        );
        let (a, b) = (original.stats(), again.stats());
        assert_eq!(a.allocated_bytes.all.current, b.allocated_bytes.all.current);
        assert_eq!(a.reserved_bytes.all.peak, b.reserved_bytes.all.peak);
        assert_eq!(a.requested_bytes.all.peak, b.requested_bytes.all.peak);
    }
}

fn json_category(trace: &Trace, id: u64) -> Category {
    trace
        .events
        .iter()
        .find_map(|e| match *e {
            ReplayEvent::Alloc {
                id: i, category, ..
            } if i == id => Some(category),
            _ => None,
        })
        .unwrap()
}

#[test]
fn a_labelled_trace_replays_into_snapshot_frames_naming_module_and_op() {
    // Two allocations as `headroom trace` writes them; the snapshot's events carry the category,
    // then the module and op, then the step and phase, in one frame each.
    let json = br#"[
        {"action": "alloc", "addr": 1, "size": 4096, "category": "activation",
         "phase": "forward", "step": 0, "module": "model.h.0.mlp", "op": "aten::addmm"},
        {"action": "alloc", "addr": 2, "size": 100, "category": "temporary", "phase": "backward",
         "step": 0, "op": "aten::mm"},
        {"action": "free", "addr": 2}
    ]"#;
    let trace = parse_trace(json).unwrap();
    let mut a = CachingAllocator::new(
        1 << 30,
        AllocatorConfig::default(),
        Box::new(VirtualSource::default()),
    );
    a.trace_mut().record_history(true, usize::MAX);
    replay(&trace, &mut a);
    let snapshot = Snapshot::capture(&a);
    let names: Vec<(&str, &str)> = snapshot.device_traces[0]
        .iter()
        .filter(|e| e.action == "alloc" || e.action == "free_completed")
        .map(|e| (e.action, e.frames[0].name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            (
                "alloc",
                "activation:model.h.0.mlp aten::addmm [step 0 forward]"
            ),
            ("alloc", "temporary:aten::mm [step 0 backward]"),
            ("free_completed", "temporary:aten::mm [step 0 backward]"),
        ]
    );
}
