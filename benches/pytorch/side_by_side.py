#!/usr/bin/env python3
"""headroom against PyTorch on the same CPU, in one run: each mode trains the same GPT with
`gpt_peer.py` (PyTorch) and with `headroom train`, one right after the other, and the table
gives the ratios headroom/PyTorch for tokens/s and for peak memory.

Modes (PyTorch setting / headroom setting):
  fp32-naive   fp32, materialised attention        / fp32, --attention naive
  fp32-sdpa    fp32, scaled_dot_product_attention  / fp32, --attention memory-efficient
  bf16         bf16 autocast                       / bf16-mixed, --attention naive
  ckpt         fp32, checkpoint every block        / fp32, --checkpoint all

Tokens/s on both sides are the mean over the steps after the first five. Memory is PyTorch's
VmHWM growth over training against headroom's peak RSS of the whole process (which includes
the binary, the corpus and the allocator's reserve), so the memory ratio is conservative.

Example (the issue-18 GPT, 2 threads each; see docs/benchmarks.md):
  cargo build --release -p headroom
  ~/venvs/torch/bin/python benches/pytorch/side_by_side.py --rounds 2 \\
      --layers 6 --width 384 --heads 6 --seq-len 256 --micro-batch 16 --steps 20
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = {
    "fp32-naive": (["--precision", "fp32", "--attention", "naive"],
                   ["--precision", "fp32", "--attention", "naive", "--checkpoint", "none"]),
    "fp32-sdpa": (["--precision", "fp32", "--attention", "sdpa"],
                  ["--precision", "fp32", "--attention", "memory-efficient",
                   "--checkpoint", "none"]),
    "bf16": (["--precision", "bf16-mixed", "--attention", "naive"],
             ["--precision", "bf16-mixed", "--attention", "naive", "--checkpoint", "none"]),
    "ckpt": (["--precision", "fp32", "--attention", "naive", "--checkpoint", "block"],
             ["--precision", "fp32", "--attention", "naive", "--checkpoint", "all"]),
}
WARM_UP = 5


def run_torch(args, extra, out):
    cmd = [sys.executable, str(HERE / "gpt_peer.py"), *shape(args), "--steps", str(args.steps),
           "--threads", str(args.threads), *extra, "--json", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    r = json.loads(out.read_text())
    return r["tokens_per_s"], r["peak_rss_growth_bytes"], r["final_train_loss"]


def run_headroom(args, extra, out):
    cmd = [args.headroom, "train", "--model", "gpt-small", *shape(args), "--accumulation", "1",
           "--optimizer", "adamw", "--no-auto", "--steps", str(args.steps), "--eval-every", "0",
           "--no-timeline", "--device-memory", args.device_memory, *extra,
           "--json-report", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "RAYON_NUM_THREADS": str(args.threads)})
    r = json.loads(out.read_text())
    times = r["step_times_s"][WARM_UP:] or r["step_times_s"]
    tokens = args.micro_batch * args.seq_len
    return tokens * len(times) / sum(times), r["host"]["peak_rss_bytes"], r["losses"][-1]


def shape(args):
    return ["--layers", str(args.layers), "--width", str(args.width), "--heads", str(args.heads),
            "--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--headroom", default="target/release/headroom",
                    help="the headroom binary (default: %(default)s)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    ap.add_argument("--rounds", type=int, default=1, help="times to run every mode")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2, help="threads for each side")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--device-memory", default="8GiB", help="headroom's device budget")
    ap.add_argument("--json", type=Path, help="also write every measurement to this file")
    args = ap.parse_args()
    if args.steps <= WARM_UP:
        ap.error(f"--steps must exceed the {WARM_UP} warm-up steps")
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    if not Path(args.headroom).is_file():
        ap.error(f"no headroom binary at {args.headroom}: run `cargo build --release -p headroom`"
                 " or pass --headroom PATH")

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t_out, h_out = Path(tmp) / "torch.json", Path(tmp) / "headroom.json"
        for rnd in range(1, args.rounds + 1):
            for mode in modes:
                torch_extra, headroom_extra = MODES[mode]
                t_tps, t_mem, t_loss = run_torch(args, torch_extra, t_out)
                h_tps, h_mem, h_loss = run_headroom(args, headroom_extra, h_out)
                rows.append(dict(round=rnd, mode=mode, torch_tokens_per_s=t_tps,
                                 headroom_tokens_per_s=h_tps, speed_ratio=h_tps / t_tps,
                                 torch_peak_rss_growth_bytes=t_mem,
                                 headroom_peak_rss_bytes=h_mem, memory_ratio=h_mem / t_mem,
                                 torch_final_loss=t_loss, headroom_final_loss=h_loss))
                r = rows[-1]
                print(f"round {rnd} {mode:<10} PyTorch {t_tps:>8,.0f} tok/s  headroom "
                      f"{h_tps:>8,.0f} tok/s  ratio {r['speed_ratio']:.2f}x  memory "
                      f"{t_mem / 2**20:,.0f} -> {h_mem / 2**20:,.0f} MiB "
                      f"({r['memory_ratio']:.2f}x)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
