"""A traced training step written as a PyTorch memory snapshot (`headroom trace --snapshot`,
`headroom.trace(snapshot=...)`): Python's `pickle` reads it, it has the keys and event actions
pytorch.org/memory_viz reads (those of `torch.cuda.memory._snapshot()`), and the peaks computed
from its events alone equal the replay report's."""

import json
import pickle
import subprocess

import headroom

ROUND = 512  # the caching allocator rounds every request up to a multiple of 512 bytes
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}


def running_peak(deltas):
    live = peak = 0
    for d in deltas:
        live += d
        peak = max(peak, live)
    return peak


def check_snapshot(snap, stats, traced_allocs):
    assert set(snap) >= {"segments", "device_traces", "allocator_settings"}
    assert len(snap["device_traces"]) == 1
    events = snap["device_traces"][0]
    assert {e["action"] for e in events} <= ACTIONS
    allocs = [e for e in events if e["action"] == "alloc"]
    assert len(allocs) == traced_allocs
    for e in events:
        assert isinstance(e["addr"], int) and isinstance(e["size"], int) and e["stream"] == 0
        for frame in e["frames"]:
            assert set(frame) == {"filename", "line", "name"}
    # Every allocation's frame names its category, its module and op, and its step and phase.
    assert all(" [step " in e["frames"][0]["name"] for e in allocs)
    assert any(e["frames"][0]["name"].startswith("activation:model.") for e in allocs)

    # The peaks from the events alone, as memory_viz draws them: requested bytes live between
    # alloc and free_completed; each request rounded up to 512 bytes is what the allocator
    # hands out; the segments are what it reserved from the device.
    requested = [e["size"] if e["action"] == "alloc" else -e["size"]
                 for e in events if e["action"] in ("alloc", "free_completed")]
    rounded = [(1 if d > 0 else -1) * (-(-abs(d) // ROUND) * ROUND) for d in requested]
    reserved = [e["size"] if e["action"] == "segment_alloc" else -e["size"]
                for e in events if e["action"] in ("segment_alloc", "segment_free")]
    assert running_peak(requested) == stats["requested_bytes.all.peak"]
    assert running_peak(rounded) == stats["allocated_bytes.all.peak"]
    assert running_peak(reserved) == stats["reserved_bytes.all.peak"]

    # The segments at the end: what is reserved, and in it what is still allocated.
    segments = snap["segments"]
    assert sum(s["total_size"] for s in segments) == stats["reserved_bytes.all.current"]
    active = [b for s in segments for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sum(b["size"] for b in active) == stats["allocated_bytes.all.current"]
    assert all(b["state"] in {"active_allocated", "inactive"} for s in segments for b in s["blocks"])


def test_cli_trace_writes_a_snapshot_whose_events_give_the_replayed_peak(
    gpt2_config, tmp_path, headroom_cli, cli_env
):
    trace, snapshot = tmp_path / "trace.json", tmp_path / "trace.pickle"
    out = subprocess.run(
        [headroom_cli, "trace", str(gpt2_config), "--micro-batch", "2", "--seq-len", "16",
         "--steps", "2", "-o", str(trace), "--json", "--snapshot", str(snapshot)],
        capture_output=True, text=True, env=cli_env, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    events = json.loads(trace.read_text())
    with open(snapshot, "rb") as f:
        snap = pickle.load(f)
    check_snapshot(snap, report["stats"], sum(1 for e in events if e["action"] == "alloc"))


def test_python_trace_writes_the_same_snapshot(gpt2_config, tmp_path):
    snapshot = tmp_path / "api.pickle"
    events = headroom.trace(gpt2_config, micro_batch=2, seq_len=16, steps=1, snapshot=snapshot)
    report = headroom.replay(events)
    with open(snapshot, "rb") as f:
        snap = pickle.load(f)
    check_snapshot(snap, report["stats"], sum(1 for e in events if e["action"] == "alloc"))
