"""The doctor's catalogue: deliberately wrong training loops (doctor_catalogue/*.py), each traced
on the CPU under `headroom.tracing` and diagnosed by `headroom.doctor`. The line at fault is
found independently, by the `# MISTAKE` comment in the loop's file; the doctor must name the
mistake, that file and line (where it made the tensors or where it keeps them), and a fix. The
correct loops beside them must show no leak at all."""

import importlib
from pathlib import Path

import pytest

import headroom

CATALOGUE = Path(__file__).parent / "doctor_catalogue"

# loop -> the mistake the doctor must name.
WRONG = {
    "loss_summed": "loss_kept_with_graph",
    "losses_in_list": "loss_kept_with_graph",
    "outputs_in_list": "outputs_kept_in_list",
    "no_zero_grad": "gradients_never_cleared",
    "eval_without_no_grad": "evaluation_builds_graph",
    "eval_leak": "outputs_kept_in_list",
    "hidden_state": "state_carried_with_graph",
}
CORRECT = ["correct_basic", "correct_zero_in_place", "correct_truncated_bptt", "correct_accumulation_eval"]


def marked_line(name: str) -> int:
    lines = (CATALOGUE / f"{name}.py").read_text().splitlines()
    marked = [i + 1 for i, text in enumerate(lines) if "# MISTAKE" in text]
    assert len(marked) == 1, f"{name}.py must mark exactly one line"
    return marked[0]


def traced(name: str, tmp_path: Path, device: str = "cpu") -> Path:
    module = importlib.import_module(f"doctor_catalogue.{name}")
    out = tmp_path / f"{name}.json"
    with headroom.tracing(out, device=device) as t:
        module.train()
    assert t.optimizer_steps >= 1 and out.exists()
    return out


# Traced with CUDA's kernels too: the cuBLASLt workspace a biased linear layer makes once and
# keeps (`other`) is no leak, and must not change what the leak looks like.
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", sorted(WRONG))
def test_the_doctor_names_the_mistake_its_line_and_the_fix(name, device, tmp_path):
    d = headroom.doctor(traced(name, tmp_path, device))
    path = str(CATALOGUE / f"{name}.py")
    line = marked_line(name)
    named = [f for f in d["leaks"]["findings"] if f["mistake"] == WRONG[name]]
    assert named, f"{name}: {d['leaks']['findings']}"
    f = named[0]
    assert f["frame"]["filename"] == path
    lines = {f["frame"]["line"]} | ({f["kept_at"][0]} if f["kept_at"] else set())
    assert line in lines, f"{name}: the doctor points at {lines}, the mistake is at line {line}"
    assert f["fix"] and len(f["fix"]) > 20
    assert f["bytes"] > 0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_loop_shows_no_leak(name, device, tmp_path):
    d = headroom.doctor(traced(name, tmp_path, device))
    assert d["leaks"]["unchecked"] is None  # enough steps to judge
    assert d["leaks"]["findings"] == []
    assert d["leaks"]["growth_per_step"] is None
    assert d["carryover"] is None


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_previous_steps_output_held_through_the_peak_is_named(device, tmp_path):
    # outputs_held.py's model returns a 1,024 × 16,384 fp32 state (64 MiB) beside its
    # 1,024 × 10 fp32 logits (40,960 bytes); `out = model(x)` keeps the previous step's until
    # the next forward has returned, the peak. Both are released in the next step: no leak.
    name = "outputs_held"
    d = headroom.doctor(traced(name, tmp_path, device))
    c = d["carryover"]
    assert c["bytes"] == 64 * 2**20 + 1024 * 10 * 4
    assert c["kept_by"]["filename"] == str(CATALOGUE / f"{name}.py")
    assert c["kept_by"]["line"] == marked_line(name)
    assert c["code"].startswith("out = model(x)")
    assert "del out" in c["fix"]
    assert d["peak"]["phase"] == "forward"
    assert d["leaks"]["findings"] == []


def test_a_fragmentation_bound_oom_is_avoided_by_expandable_segments(tmp_path):
    # Six 6 MiB chunks fill two 20 MiB segments of the caching allocator (requests of 1 to
    # 10 MiB share 20 MiB segments), and the model's small tensors a 2 MiB one: 42 MiB. Keeping
    # the second and fifth chunk leaves holes of 6 and 8 MiB in each segment; the 9 MiB buffer
    # fits in none and needs a third segment, which 42 MiB does not allow, though 12 MiB of
    # chunks + 9 MiB fit in it.
    trace = traced("fragmentation_oom", tmp_path)
    capacity = "42MiB"
    d = headroom.doctor(trace, capacity=capacity)
    oom = d["fragmentation"]["caching"]["first_oom"]
    assert oom is not None and oom["fragmentation_bound"]
    assert oom["requested_bytes"] == 9 << 20
    assert oom["largest_free_block_bytes"] < oom["requested_bytes"]
    # The failing request is the marked line's.
    import json

    events = json.loads(trace.read_text())
    assert events[oom["event_index"]]["frames"][0]["line"] == marked_line("fragmentation_oom")
    # ...and the doctor names it: the file and the line of the failed request.
    assert oom["frame"]["filename"].endswith("fragmentation_oom.py")
    assert oom["frame"]["line"] == marked_line("fragmentation_oom")
    # The doctor's replay with expandable segments goes through...
    assert d["fragmentation"]["expandable"]["first_oom"] is None
    # ...and `headroom memory replay` confirms it, as it confirms the caching allocator's OOM.
    expandable = headroom.replay(trace, allocator="expandable", capacity=capacity)
    caching = headroom.replay(trace, allocator="caching", capacity=capacity)
    assert expandable["outcome"]["ooms"] == []
    assert caching["outcome"]["ooms"]


def test_tracing_records_frames_phases_and_steps(tmp_path):
    trace = traced("correct_basic", tmp_path)
    import json

    events = json.loads(trace.read_text())
    allocs = [e for e in events if e["action"] == "alloc"]
    # Five optimizer steps: steps 0..4, every phase seen, a zero_grad mark per step.
    assert {e["step"] for e in allocs} == set(range(5))
    assert {"forward", "backward", "optimizer"} <= {e["phase"] for e in allocs}
    assert sum(1 for e in events if e["action"] == "mark" and e["phase"] == "zero_grad") == 5
    # Frames are the loop file's own, innermost first; no torch or headroom frame.
    path = str(CATALOGUE / "correct_basic.py")
    assert all(e["frames"][0]["filename"] == path for e in allocs)
    package = str(Path(headroom.__file__).parent)
    filenames = {f["filename"] for e in allocs for f in e["frames"]}
    assert not any("/torch/" in f or f.startswith(package) for f in filenames)
    assert all(len(e["frames"]) <= 16 for e in allocs)
    cats = {e["category"] for e in allocs}
    assert {"parameter", "gradient", "optimizer_state", "activation", "input"} <= cats


def test_steps_end_the_block_early(tmp_path):
    module = importlib.import_module("doctor_catalogue.correct_basic")
    with headroom.tracing(tmp_path / "t.json", steps=2) as t:
        module.train(steps=10)
    assert t.optimizer_steps == 2
    assert max(e["step"] for e in t.events if e["action"] == "alloc") == 1
