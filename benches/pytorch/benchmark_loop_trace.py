"""The Transformers docs' SDPA training benchmark loop, traced without a GPU.

The model pages of GPT-2, GPT-NeoX and BERT publish peak memory of a training benchmark
(fxmarty's SDPA training script, as their pull requests link it): a 16-bit model, random token
ids and an all-ones mask, and per step

    model.zero_grad(); out = model(**inputs); out.logits.sum().backward()

with the peak read by `torch.cuda.max_memory_allocated`. `out` is reassigned only when the next
forward has returned, so that forward ends with the previous step's logits and the key/value
cache the model returned still alive. This script runs that loop under `headroom.tracing`
(fake tensors, CUDA kernels emulated) and prints the traced peak; `--drop-outputs` deletes `out`
after each backward, the loop without that hold. The rows of
`crates/plan/tests/data/published/hf_runs.toml` ran transformers 4.42; to trace that version,
install it apart and name its folder:

    .venv/bin/pip install --no-deps --target /tmp/tf442 transformers==4.42.4 tokenizers==0.19.1
    .venv/bin/python benches/pytorch/benchmark_loop_trace.py \\
        --config crates/plan/tests/data/published/pythia-410m.json \\
        --attention sdpa --batch 1 --seq-len 2048 --transformers /tmp/tf442

(transformers 4.42 checks its dependencies' versions on import; where the installed ones are
newer than it allows, that check has to be skipped for the trace.)

The peak is of requested sizes (no allocator rounding) and leaves out `other` (the cuBLAS
workspaces: PyTorch 2.2 kept one of 8 MiB, today's takes one per call).
"""

from __future__ import annotations

import argparse
import json
import sys

MIB = 1024 * 1024


def trace_loop(config: dict, attention: str, batch: int, seq_len: int, steps: int = 3,
               drop_outputs: bool = False) -> list[dict]:
    """The benchmark's loop under `headroom.tracing` (CUDA kernels, sm80), `steps` times; the
    events. `config` is a config.json's fields."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    import headroom

    cfg = dict(config)
    cfg.pop("torch_dtype", None)
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    masked = any(arch.endswith("ForMaskedLM") for arch in cfg.get("architectures", []))
    auto = AutoModelForMaskedLM if masked else AutoModelForCausalLM
    with headroom.tracing(device="cuda", cuda_arch="sm80") as t:
        # `from_pretrained(torch_dtype=torch.float16)` builds under an fp16 default dtype: the
        # weights are fp16, buffers a model makes in fp32 explicitly stay fp32.
        torch.set_default_dtype(torch.float16)
        try:
            model = auto.from_config(hf_config, attn_implementation=attention)
        finally:
            torch.set_default_dtype(torch.float32)
        model.train()
        shape = (batch, seq_len)
        inputs = {"input_ids": torch.randint(0, 1000, shape), "attention_mask": torch.ones(shape, dtype=torch.int64)}
        for _ in range(steps):
            model.zero_grad()
            out = model(**inputs)
            out.logits.sum().backward()
            if drop_outputs:
                del out
    return t.events


def peak(events: list[dict]) -> tuple[int, dict, dict]:
    """The largest total of live requested bytes leaving `other` out, the event that reached
    it, and the allocations live then (by address)."""
    live: dict = {}
    now, most, at, snapshot = 0, 0, None, {}
    for e in events:
        if e["action"] == "alloc" and e["category"] != "other":
            live[e["addr"]] = e
            now += e["size"]
            if now > most:
                most, at, snapshot = now, e, dict(live)
        elif e["action"] == "free" and e["addr"] in live:
            now -= live.pop(e["addr"])["size"]
    return most, at, snapshot


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a Hugging Face config.json")
    p.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--steps", type=int, default=3, help="loop iterations (at least 2)")
    p.add_argument("--drop-outputs", action="store_true", help="del out after each backward")
    p.add_argument("--transformers", help="a folder holding another transformers install")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args()
    from hf_config import read_config, require_positive, use_transformers  # this folder's

    require_positive(p, seq_len=a.seq_len, batch=a.batch)
    if a.steps < 2:
        p.error("--steps must be at least 2: the hold is between one step and the next")
    use_transformers(a.transformers)
    import torch
    import transformers

    config = read_config(p, a.config)
    events = trace_loop(config, a.attention, a.batch, a.seq_len, a.steps, a.drop_outputs)
    most, at, _ = peak(events)
    figures = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "peak_mib": round(most / MIB, 1),
        "peak_phase": at["phase"],
        "peak_op": at["op"],
        "peak_module": at.get("module"),
    }
    if a.json:
        print(json.dumps(figures))
    else:
        print(
            f"transformers {figures['transformers']}: peak {figures['peak_mib']} MiB "
            f"({figures['peak_phase']}, {figures['peak_op']} in {figures['peak_module']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
