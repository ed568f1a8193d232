"""A Hugging Face Trainer's training step, traced without a GPU and replayed through the allocator.

A published run that ran out of memory, or fit, is a claim about one configuration. This script
traces that configuration's steps under `headroom.tracing` (fake tensors, CUDA kernels emulated)
as the Trainer runs them,

    out = model(input_ids=ids, labels=ids); loss = out.loss; del out
    loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

with the model built from its config.json in the config's dtype (what `from_pretrained` and
`from_config` do with `torch_dtype`), then replays the trace through headroom's caching
allocator at the GPU's capacity: the peak allocated, the peak reserved and whether it runs out.

- `--optimizer adamw-8bit` allocates what bitsandbytes' 8-bit AdamW does at a parameter's first
  step: two one-byte states per element and an fp32 absmax per 256-element block for each
  (`bitsandbytes/optim/optimizer.py`, `init_state`; the update runs in place).
- `--attention flash-varlen` is transformers' FlashAttention-2 path for packed rows
  (`prepare_fa2_from_position_ids` in `modeling_flash_attention_utils.py`, 4.44-4.5x): the
  query viewed, the key and value copied contiguous, and flash attention saving q, k, v, its
  output and log-sum-exp (emulated with the CUDA flash SDPA kernel, which saves the same).
- `--no-cache` sets `use_cache = False`, as Axolotl and gradient checkpointing do; otherwise a
  decoder's training forward also builds the key/value cache.
- `--transformers DIR` traces another transformers install (see benchmark_loop_trace.py).

    .venv/bin/python benches/pytorch/trainer_step_trace.py \\
        --config crates/plan/tests/data/published/smollm2-1.7b.json --seq-len 16384 \\
        --optimizer adamw-8bit --attention flash-varlen --no-cache --capacity-gib 79.65

The allocated peak counts every allocation, `other` (cuBLAS workspaces) included; the CUDA
context is not an allocation and is not in it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

GIB = 1024**3


def eight_bit_adamw(torch):
    """An optimizer whose allocations are bitsandbytes' 8-bit AdamW's (the update in place)."""

    class EightBitAdamW(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-5):
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:
                        blocks = math.ceil(p.numel() / 256)
                        state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
                        state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
                        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32)
                        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32)
                    p.add_(p.grad, alpha=-group["lr"])

    return EightBitAdamW


def flash_varlen(torch):
    """transformers' FlashAttention-2 forward for packed rows, as an attention function."""
    import torch.nn.functional as F

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        b, h, s, d = query.shape
        q = query.transpose(1, 2).reshape(-1, h, d)
        k = key.transpose(1, 2).contiguous().view(-1, key.size(1), d)
        v = value.transpose(1, 2).contiguous().view(-1, value.size(1), d)
        heads = lambda t: t.view(b, s, -1, d).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(
            heads(q), heads(k), heads(v), is_causal=True, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).reshape(b, s, h, d), None

    return forward


def trace_steps(config: dict, seq_len: int, batch: int = 1, optimizer: str = "adamw",
                attention: str = "sdpa", use_cache: bool = True, steps: int = 3) -> list[dict]:
    """`steps` Trainer steps of the model `config` describes, traced; the events."""
    import torch
    from transformers import AutoConfig

    cfg = dict(config)
    dtype = getattr(torch, cfg.pop("torch_dtype", None) or "float32")
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    hf_config.use_cache = use_cache
    implementation, functions, sdpa = attention, None, None
    if attention == "flash-varlen":
        # Stands in for "sdpa" during the trace only; put back after, for the rest of the process.
        import transformers.modeling_utils as modeling_utils

        functions = modeling_utils.ALL_ATTENTION_FUNCTIONS
        sdpa = functions["sdpa"]
        functions["sdpa"] = flash_varlen(torch)
        implementation = "sdpa"
    try:
        return _traced(torch, hf_config, dtype, implementation, seq_len, batch, optimizer, steps)
    finally:
        if functions is not None:
            functions["sdpa"] = sdpa


def _traced(torch, hf_config, dtype, implementation, seq_len, batch, optimizer, steps):
    """The Trainer's steps under `headroom.tracing`; the events."""
    from transformers import AutoModelForCausalLM

    import headroom

    with headroom.tracing(device="cuda", cuda_arch="sm90") as t:
        torch.set_default_dtype(dtype)
        try:
            model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=implementation)
        finally:
            torch.set_default_dtype(torch.float32)
        model.train()
        if optimizer == "adamw-8bit":
            opt = eight_bit_adamw(torch)(model.parameters())
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        ids = torch.randint(0, 1000, (batch, seq_len))
        for _ in range(steps):
            out = model(input_ids=ids, labels=ids)
            loss = out.loss
            del out
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return t.events


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a Hugging Face config.json")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--optimizer", choices=("adamw", "adamw-8bit"), default="adamw")
    p.add_argument("--attention", choices=("sdpa", "eager", "flash-varlen"), default="sdpa")
    p.add_argument("--no-cache", action="store_true", help="use_cache = False")
    p.add_argument("--steps", type=int, default=3, help="Trainer steps (at least 2)")
    p.add_argument("--capacity-gib", type=float, default=80.0, help="the GPU's memory, GiB")
    p.add_argument("--transformers", help="a folder holding another transformers install")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args()
    from hf_config import read_config, require_positive, use_transformers  # this folder's

    require_positive(p, seq_len=a.seq_len, batch=a.batch, capacity_gib=a.capacity_gib)
    if a.steps < 2:
        p.error("--steps must be at least 2: optimizer states exist from the second step on")
    use_transformers(a.transformers)
    import transformers

    import headroom

    config = read_config(p, a.config)
    events = trace_steps(config, a.seq_len, a.batch, a.optimizer, a.attention,
                         not a.no_cache, a.steps)
    report = headroom.replay(events, capacity=f"{a.capacity_gib}GiB")
    stats, at = report["stats"], report["at_peak"]
    figures = {
        "transformers": transformers.__version__,
        "allocated_gib": round(stats["allocated_bytes.all.peak"] / GIB, 2),
        "reserved_gib": round(stats["reserved_bytes.all.peak"] / GIB, 2),
        "out_of_memory": len(report["outcome"]["ooms"]) > 0,
        "peak_phase": at["phase"],
        "peak_step": at["step"],
        "peak_op": at["op"],
    }
    if a.json:
        print(json.dumps(figures))
    else:
        verdict = "runs out of memory" if figures["out_of_memory"] else "fits"
        print(
            f"transformers {figures['transformers']}: peak {figures['allocated_gib']} GiB "
            f"allocated, {figures['reserved_gib']} GiB reserved ({figures['peak_phase']} of "
            f"step {figures['peak_step']}, {figures['peak_op']}); {verdict} in "
            f"{a.capacity_gib} GiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
