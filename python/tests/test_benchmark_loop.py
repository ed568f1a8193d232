"""The published SDPA benchmarks' loop (`benches/pytorch/benchmark_loop_trace.py`): `out =
model(**inputs); out.logits.sum().backward()` keeps the previous step's `out` until the next
forward has returned, so that forward ends with the previous logits and the key/value cache the
model returned still allocated. What the planner charges for it (`previous_outputs` in the plan
crate) is checked here against the loop traced, byte for byte by hand."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "benches" / "pytorch" / "benchmark_loop_trace.py"

# A small GPT-NeoX: 2 blocks, width 64 in 4 heads of 16, vocabulary 1,000, its cache on.
CONFIG = {
    "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 64,
    "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 256,
    "vocab_size": 1000, "rotary_pct": 0.25, "max_position_embeddings": 128, "use_cache": True,
    "tie_word_embeddings": False,
}
B, S = 2, 32


def _bench():
    spec = importlib.util.spec_from_file_location("benchmark_loop_trace", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("benchmark_loop_trace", module)
    spec.loader.exec_module(module)
    return module


def previous_step_live_at_second_head(events):
    """Bytes allocated during the first step (between the first two `zero_grad` marks) still
    live when the second step's forward makes its logits (the head's output)."""
    marks = [i for i, e in enumerate(events) if e["action"] == "mark" and e["phase"] == "zero_grad"]
    first, second = marks[0], marks[1]
    head = next(
        i for i in range(second, len(events))
        if events[i]["action"] == "alloc" and (events[i].get("module") or "").endswith("lm_head")
        and events[i]["phase"] == "forward"
    )
    live = {}
    for e in events[: head + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free":
            live.pop(e["addr"], None)
    made = {id(e) for e in events[first:second] if e["action"] == "alloc"}
    return sum(e["size"] for e in live.values() if id(e) in made and e["category"] != "other")


def test_the_next_forward_ends_holding_the_previous_logits_and_cache():
    # fp16 logits 2·B·S·V = 2·2·32·1000 = 128,000 bytes; the cache's K and V copies in each of
    # 2 blocks, 2·2·(B·S·64) fp16 = 2·2·2·(2·32·64) = 32,768 bytes: 160,768, the planner's
    # `previous_outputs` for this shape. Deleting `out` after backward leaves nothing.
    bench = _bench()
    held = bench.trace_loop(CONFIG, "sdpa", B, S)
    assert previous_step_live_at_second_head(held) == 2 * B * S * 1000 + 2 * 2 * 2 * B * S * 64 == 160_768
    dropped = bench.trace_loop(CONFIG, "sdpa", B, S, drop_outputs=True)
    assert previous_step_live_at_second_head(dropped) == 0


def test_without_its_cache_the_model_leaves_only_the_logits():
    # use_cache off: the previous output holds its logits alone, 128,000 bytes.
    bench = _bench()
    events = bench.trace_loop({**CONFIG, "use_cache": False}, "sdpa", B, S)
    assert previous_step_live_at_second_head(events) == 2 * B * S * 1000
