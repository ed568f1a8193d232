"""`headroom trace` end to end: the Rust command runs the Python tracer, writes the trace and
replays it; `headroom memory replay` reads the same file again, and its snapshot too."""

import json
import subprocess
from collections import defaultdict

from test_trace import gpt2_tensors

F32, ROUND = 4, 512


def run(cli, env, *args):
    return subprocess.run([cli, *args], capture_output=True, text=True, env=env, timeout=600)


def rounded(nbytes):
    return -(-nbytes // ROUND) * ROUND


def test_trace_then_replay(gpt2_config, tmp_path, headroom_cli, cli_env):
    trace = tmp_path / "trace.json"
    snapshot = tmp_path / "trace.pickle"
    out = run(
        headroom_cli, cli_env, "trace", str(gpt2_config), "--micro-batch", "2", "--seq-len", "16",
        "--steps", "2", "--output", str(trace), "--json", "--snapshot", str(snapshot),
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    events = json.loads(trace.read_text())
    allocs = [e for e in events if e["action"] == "alloc"]
    assert report["format"] == "headroom_json"
    assert report["outcome"]["allocs"] == len(allocs)
    assert report["outcome"]["frees"] == len(events) - len(allocs)
    assert report["outcome"]["ooms"] == []
    # After the last step: the parameters and AdamW's two moments, each tensor rounded up to
    # the caching allocator's 512 bytes.
    params = sum(rounded(n * F32) for n in gpt2_tensors())
    stats = report["stats"]
    assert stats["category_bytes.parameter.current"] == params
    assert stats["category_bytes.optimizer_state.current"] == 2 * params
    assert stats["category_bytes.gradient.current"] == 0
    # The allocation that set the peak is one of the trace's, named with its phase.
    peak = report["at_peak"]
    assert peak["phase"] in {"forward", "backward", "optimizer"}
    assert allocs[0]["addr"] != 0 and peak["size"] in {e["size"] for e in allocs}
    # The peak is at least the model states of one step: parameters, gradients, both moments.
    assert stats["allocated_bytes.all.peak"] >= 4 * params

    again = run(headroom_cli, cli_env, "memory", "replay", str(trace), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["stats"] == stats
    snap = run(headroom_cli, cli_env, "memory", "replay", str(snapshot), "--json")
    assert snap.returncode == 0, snap.stderr
    assert json.loads(snap.stdout)["format"] == "pytorch_snapshot"


def test_text_report_names_the_phase_at_the_peak(gpt2_config, tmp_path, headroom_cli, cli_env):
    out = run(headroom_cli, cli_env, "trace", str(gpt2_config), "--seq-len", "8", "--steps", "1",
              "-o", str(tmp_path / "t.json"))
    assert out.returncode == 0, out.stderr
    assert "The allocated peak is reached in " in out.stdout


def test_bad_inputs_are_one_clear_line(tmp_path, headroom_cli, cli_env):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "not-a-model"}')
    out = run(headroom_cli, cli_env, "trace", str(bad), "--seq-len", "8", "-o", str(tmp_path / "t.json"))
    assert out.returncode != 0
    assert "unknown model_type 'not-a-model'" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "t.json").exists()

    env = dict(cli_env, HEADROOM_PYTHON=str(tmp_path / "no-such-python"))
    out = run(headroom_cli, env, "trace", str(bad), "--seq-len", "8")
    assert out.returncode != 0
    assert "cannot run Python" in out.stderr and "HEADROOM_PYTHON" in out.stderr


def test_trace_of_an_fsdp2_rank_replays_its_shards(llama_config, tmp_path, headroom_cli, cli_env):
    from test_trace_fsdp import BLOCK, LAYERS, RANKS, ROOT, rows

    trace = tmp_path / "fsdp.json"
    out = run(
        headroom_cli, cli_env, "trace", str(llama_config), "--micro-batch", "2", "--seq-len", "16",
        "--steps", "1", "--device", "cpu", "--fsdp", str(RANKS), "--output", str(trace), "--json",
    )
    assert out.returncode == 0, out.stderr
    # After the step only each parameter's padded shard is held, each rounded to 512 bytes.
    shards = sum(rounded(rows(d0) * rest * F32) for d0, rest in ROOT + BLOCK * LAYERS)
    assert json.loads(out.stdout)["stats"]["category_bytes.parameter.current"] == shards
    refused = run(headroom_cli, cli_env, "trace", str(llama_config), "--seq-len", "16",
                  "--no-reshard-after-forward", "--output", str(tmp_path / "x.json"))
    assert refused.returncode == 2 and "--fsdp" in refused.stderr
