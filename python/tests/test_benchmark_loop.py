"""Loops that keep the model's output, traced and counted by hand. The published SDPA
benchmarks' loop (`benches/pytorch/benchmark_loop_trace.py`): `out = model(**inputs);
out.logits.sum().backward()` keeps the previous step's `out` until the next forward has
returned, so that forward ends with the previous logits and the key/value cache the model
returned still allocated; a Hugging Face loop that keeps `outputs` holds the logits through
backward. The bytes are counted by hand here, against the loops traced; the planner's formulas
for them (`previous_outputs` and `kept_logits` in the plan crate, `--loop-keeps-outputs`) give
the same bytes, which the plan crate's own tests hold it to."""


import pytest
from conftest import BENCHES, bench_script

pytest.importorskip("transformers")


# A small GPT-NeoX: 2 blocks, width 64 in 4 heads of 16, vocabulary 1,000, its cache on.
CONFIG = {
    "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 64,
    "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 256,
    "vocab_size": 1000, "rotary_pct": 0.25, "max_position_embeddings": 128, "use_cache": True,
    "tie_word_embeddings": False,
}
B, S = 2, 32


def _bench():
    return bench_script("benchmark_loop_trace")


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


def _loop_peak(keep_outputs: bool) -> int:
    """Three AdamW steps of a small Llama in bf16 under the Hugging Face loss, the loop keeping
    `outputs` or the loss alone (as the Trainer's `compute_loss` does); the peak less `other`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import headroom

    config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4)
    with headroom.tracing() as t:
        torch.set_default_dtype(torch.bfloat16)
        model = LlamaForCausalLM(config)
        torch.set_default_dtype(torch.float32)
        opt = torch.optim.AdamW(model.parameters())
        ids = torch.randint(0, 1000, (B, S))
        for _ in range(3):
            if keep_outputs:
                outputs = model(input_ids=ids, labels=ids)
                outputs.loss.backward()
            else:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            opt.step()
            opt.zero_grad()
    return _bench().peak(t.events)[0]


def test_a_loop_that_keeps_outputs_holds_the_logits_through_backward():
    # `outputs = model(...)` keeps the bf16 logits, 2·B·S·V = 2·2·32·1000 = 128,000 bytes, through
    # the loss's backward, the peak; `.loss` alone lets them go before backward. The planner's
    # `--loop-keeps-outputs` charges the same (`kept_logits`).
    assert _loop_peak(True) - _loop_peak(False) == 2 * B * S * 1000 == 128_000


def test_the_doctor_sees_the_benchmark_loops_hold(tmp_path):
    # The benchmark loop steps no optimizer; its `zero_grad()` after each backward ends a step,
    # so the doctor finds, at the second forward's end, the first step's output still held:
    # the logits, 2·2·128·32,768 = 16,777,216 bytes, and the cache's K and V in 2 blocks,
    # 2·2·2·(2·128·64) = 131,072 bytes; kept by the loop's `out = model(**inputs)`.
    import headroom
    from headroom.trace import write_trace

    config = {**CONFIG, "vocab_size": 32768, "max_position_embeddings": 256}
    events = _bench().trace_loop(config, "sdpa", 2, 128)
    assert sorted({e["step"] for e in events if "step" in e}) == [0, 1, 2]
    write_trace(events, tmp_path / "loop.json")
    d = headroom.doctor(tmp_path / "loop.json")
    c = d["carryover"]
    assert c["bytes"] == 2 * 2 * 128 * 32768 + 2 * 2 * 2 * (2 * 128 * 64) == 16_908_288
    assert c["kept_by"]["filename"] == str(BENCHES / "benchmark_loop_trace.py")
    assert c["code"] == "out = model(**inputs)"
