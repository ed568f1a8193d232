#!/usr/bin/env python3
"""PyTorch's counterpart of `cargo bench -p headroom-tensor --bench attention -- gpt_`: one
causal attention layer of the issue-18 GPT (B 16, H 6, T 256, D 64), forward and backward, with
q, k and v as head views of one (B, T, 3C) projection, as `gpt_peer.py` builds them. Prints the
median and fastest of 20 timed runs, in milliseconds, for materialised scores ("naive") and for
`scaled_dot_product_attention` ("sdpa").

Run: ~/venvs/torch/bin/python benches/pytorch/attention_peer.py --threads 2
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    b, h, t, d = 16, 6, 256, 64
    c = h * d
    qkv = torch.randn(b, t, 3 * c, requires_grad=True)
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)

    def heads():
        q, k, v = qkv.split(c, dim=2)
        return (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))

    def naive():
        q, k, v = heads()
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        return F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v

    def sdpa():
        q, k, v = heads()
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    for name, fn in (("naive", naive), ("sdpa", sdpa)):
        for _ in range(3):
            fn().sum().backward()
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            fn().sum().backward()
            times.append(time.perf_counter() - start)
        times.sort()
        print(f"{name:6s} median {times[len(times) // 2] * 1e3:7.2f} ms   fastest {times[0] * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
