"""`headroom.trace.sweep`: every variant's trace is the trace `headroom.trace` makes of the same
setting on its own, and the levers move the bytes they should."""

import json

from conftest import GPT2
from test_trace import allocated, gpt2_tensors

from headroom.trace import trace
from headroom.trace.sweep import sweep

F32, BF16 = 4, 2
VARIANTS = [
    {"dtype": "fp32", "micro_batch": 2},
    {"dtype": "bf16", "micro_batch": 2},
    {"dtype": "fp32", "micro_batch": 2, "gradient_checkpointing": True},
    {"dtype": "fp32", "micro_batch": 1, "lora_rank": 4},
    {"dtype": "fp16-autocast", "micro_batch": 2},
]


def live_peak(events, category=None):
    """The most bytes live at once (of one category, or all), walking the allocations and frees."""
    sizes, live, peak = {}, 0, 0
    for e in events:
        if e["action"] == "alloc" and category in (None, e["category"]):
            sizes[e["addr"]] = e["size"]
            live += e["size"]
            peak = max(peak, live)
        elif e["action"] == "free":
            live -= sizes.pop(e["addr"], 0)
    return peak


def test_sweep_variants_match_single_traces_and_move_the_right_bytes(gpt2_config, tmp_path):
    results = sweep(gpt2_config, VARIANTS, seq_len=16, steps=1, output_dir=tmp_path / "sweep")
    assert [{k: v for k, v in r.items() if k in VARIANTS[i]} for i, r in enumerate(results)] == VARIANTS
    traces = [json.loads(open(r["trace"]).read()) for r in results]
    for variant, events in zip(VARIANTS, traces):
        alone = trace(gpt2_config, seq_len=16, steps=1, **variant)
        assert live_peak(events) == live_peak(alone), variant
        assert sum(1 for e in events if e["action"] == "alloc") == sum(1 for e in alone if e["action"] == "alloc")

    fp32, bf16, checkpointed, lora, fp16 = traces
    # Pure bf16 stores every parameter in 2 bytes instead of 4.
    params = sum(gpt2_tensors())
    assert allocated(fp32, "parameter") == F32 * params
    assert allocated(bf16, "parameter") == BF16 * params
    # Checkpointing every block keeps only the blocks' inputs from the forward pass.
    assert live_peak(checkpointed, "activation") < live_peak(fp32, "activation")
    # LoRA of rank 4 on GPT-2's c_attn (peft's default for gpt2): per block A is d x r and B is
    # r x 3d, the only gradients: 2 blocks x (64*4 + 4*192) x 4 bytes = 8192.
    d, r = GPT2["n_embd"], 4
    assert allocated(lora, "gradient") == GPT2["n_layer"] * (d * r + r * 3 * d) * F32 == 8192
    # fp16 autocast keeps fp32 parameters, computes in fp16, and GradScaler adds its growth
    # tracker (one int32 scalar, 4 bytes), which no other precision allocates.
    assert allocated(fp16, "parameter") == F32 * params
    assert any(e["action"] == "alloc" and e["dtype"] == "float16" for e in fp16)
    growth = [e for e in fp16 if e["action"] == "alloc" and e["dtype"] == "int32" and e["size"] == 4]
    assert len(growth) == 1
    assert not any(e["action"] == "alloc" and e["dtype"] == "int32" for e in fp32)


def test_a_variant_that_cannot_be_traced_is_reported_and_the_rest_run(gpt2_config, tmp_path):
    results = sweep(
        gpt2_config,
        [{"lora_rank": 2, "lora_targets": ["no_such_module"]}, {"dtype": "bf16"}],
        seq_len=8,
        steps=1,
        output_dir=tmp_path,
    )
    assert "no_such_module" in results[0]["error"] and "trace" not in results[0]
    assert "error" not in results[1] and (tmp_path / "variant-1.json").exists()
