"""`headroom.plan` and `headroom.replay` return the JSON the command line prints."""

import json
import subprocess

import pytest

import headroom


def cli_json(cli, *args):
    out = subprocess.run([cli, *args, "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def without_timing(report):
    report = dict(report)
    report["search"] = {k: v for k, v in report["search"].items() if k != "seconds"}
    return report


def test_plan_is_the_cli_json(gpt2_config, headroom_cli):
    ours = headroom.plan(
        model=str(gpt2_config), gpu="h100-80gb", seq_len=128, micro_batch=2, accumulation=1
    )
    theirs = cli_json(
        headroom_cli, "plan", "--model", str(gpt2_config), "--gpu", "h100-80gb",
        "--seq-len", "128", "--micro-batch", "2", "--accumulation", "1",
    )
    assert without_timing(ours) == without_timing(theirs)


def test_plan_error_is_the_cli_message(gpt2_config):
    with pytest.raises(headroom.HeadroomError, match="--seq-len is required"):
        headroom.plan(model=str(gpt2_config), gpu="h100-80gb", micro_batch=2, accumulation=1)


def test_replay_of_events_and_of_a_file_is_the_cli_json(tmp_path, headroom_cli):
    # 5 MiB, 5 MiB, free the first, 12 MiB: peak allocated 17 MiB.
    events = [
        {"action": "alloc", "addr": 1, "size": 5 << 20, "category": "activation", "phase": "forward"},
        {"action": "alloc", "addr": 2, "size": 5 << 20, "phase": "forward"},
        {"action": "free", "addr": 1},
        {"action": "alloc", "addr": 3, "size": 12 << 20, "category": "gradient", "phase": "backward"},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events))
    from_file = headroom.replay(path, allocator="expandable")
    from_events = headroom.replay(events, allocator="expandable")
    theirs = cli_json(headroom_cli, "memory", "replay", str(path), "--allocator", "expandable")
    assert from_file == theirs
    assert from_events["stats"] == theirs["stats"]
    assert theirs["stats"]["allocated_bytes.all.peak"] == 17 << 20
    assert theirs["at_peak"]["phase"] == "backward"
    assert theirs["at_peak"]["category"] == "gradient"
    assert theirs["at_peak"]["event"] == 3
