#!/usr/bin/env python3
"""How fast can an fp32 training step of the side-by-side GPT be on this CPU? The step's FLOPs
against the fastest GEMMs this machine runs, to tell a speed goal that more work can meet from
one no implementation can.

1. The step's floating-point operations, counted by PyTorch's own `FlopCounterMode`
   (`torch.utils.flop_counter`: matmuls, attention's two batched matmuls, their gradients) on
   `gpt_peer.GPT`, forward and backward of one micro-batch. Element-wise work (softmax, layer
   norm, GELU, AdamW) is not counted: it only adds time.
2. The ceiling: the fastest of PyTorch's fp32 GEMM (oneDNN/MKL) at the step's own shapes and at
   2048³, `--threads` threads, median of `--repeats` timed runs each.
3. PyTorch's end-to-end rate: `gpt_peer.py` trained for `--steps` steps; tokens/s × FLOPs per
   token, as a fraction of the ceiling.

A goal of `r`× PyTorch's tokens/s needs an implementation that runs the step's FLOPs at r times
PyTorch's rate; where that exceeds the ceiling, even a step made of nothing but the fastest
GEMM measured here would miss it.

    .venv/bin/python benches/pytorch/fp32_ceiling.py --layers 6 --width 384 --heads 6 \\
        --seq-len 256 --micro-batch 16 --threads 2
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpt_peer  # noqa: E402
from hf_config import require_positive  # noqa: E402


def step_flops(args) -> int:
    """FLOPs of one micro-batch's forward and backward, as FlopCounterMode counts them."""
    model = gpt_peer.GPT(vocab=256, seq_len=args.seq_len, width=args.width, layers=args.layers,
                         heads=args.heads, attention="naive")
    idx = torch.randint(0, 256, (args.micro_batch, args.seq_len))
    with FlopCounterMode(display=False) as counter:
        model(idx, idx).backward()
    return counter.get_total_flops()


def gemm_rate(m: int, k: int, n: int, repeats: int) -> float:
    """GFLOP/s of torch.mm at (m×k)·(k×n), the median of `repeats` timed runs."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    runs = max(1, int(2e9 / (2 * m * k * n)))  # about 2 GFLOP a timed run
    for _ in range(2):
        torch.mm(a, b)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(runs):
            torch.mm(a, b)
        rates.append(2 * m * k * n * runs / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    require_positive(ap, layers=a.layers, width=a.width, heads=a.heads, seq_len=a.seq_len,
                     micro_batch=a.micro_batch, threads=a.threads, repeats=a.repeats, steps=a.steps)
    if a.width % a.heads:
        ap.error(f"--width {a.width} must be a multiple of --heads {a.heads}")
    torch.set_num_threads(a.threads)

    tokens = a.micro_batch * a.seq_len
    flops = step_flops(a)
    w = a.width
    shapes = {
        # forward y = x·Wᵀ, backward dx = dy·W and dW = dyᵀ·x, at the step's widths
        "qkv forward": (tokens, w, 3 * w),
        "fc forward": (tokens, w, 4 * w),
        "out forward": (tokens, 4 * w, w),
        "fc weight gradient": (4 * w, tokens, w),
        "square 2048": (2048, 2048, 2048),
    }
    rates = {name: gemm_rate(*s, a.repeats) for name, s in shapes.items()}
    ceiling = max(rates.values())

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "torch.json"
        subprocess.run(
            [sys.executable, str(HERE / "gpt_peer.py"), "--layers", str(a.layers), "--width",
             str(w), "--heads", str(a.heads), "--seq-len", str(a.seq_len), "--micro-batch",
             str(a.micro_batch), "--threads", str(a.threads), "--steps", str(a.steps),
             "--precision", "fp32", "--attention", "naive", "--json", str(out)],
            check=True, stdout=subprocess.DEVNULL)
        torch_tokens_per_s = json.loads(out.read_text())["tokens_per_s"]

    per_token = flops / tokens
    achieved = torch_tokens_per_s * per_token / 1e9
    print(f"step FLOPs (FlopCounterMode, one micro-batch of {tokens} tokens): {flops:,} "
          f"({per_token / 1e6:.1f} MFLOP a token)")
    for name, r in rates.items():
        print(f"  torch.mm {name} {shapes[name]}: {r:.1f} GFLOP/s")
    print(f"ceiling (fastest GEMM above): {ceiling:.1f} GFLOP/s")
    print(f"PyTorch fp32 naive: {torch_tokens_per_s:,.0f} tokens/s = {achieved:.1f} GFLOP/s, "
          f"{achieved / ceiling:.0%} of the ceiling")
    for goal in (1.0, 1.2):
        need = goal * achieved
        print(f"  {goal}× PyTorch needs {need:.1f} GFLOP/s end to end, {need / ceiling:.0%} of "
              f"the ceiling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
