#!/usr/bin/env python3
"""headroom against PyTorch on the same CPU, in one run: each mode trains the same GPT with
`gpt_peer.py` (PyTorch) and with `headroom train`, the two interleaved, for at least three
rounds; the table gives the median ratio headroom/PyTorch for tokens/s and for peak memory.

Modes (PyTorch setting / headroom setting):
  fp32-naive   fp32, materialised attention        / fp32, --attention naive
  fp32-sdpa    fp32, scaled_dot_product_attention  / fp32, --attention memory-efficient
  bf16         bf16 autocast                       / bf16-mixed, --attention naive
  ckpt         fp32, checkpoint every block        / fp32, --checkpoint all

Tokens/s on both sides are the mean over the steps after the first five. Memory is PyTorch's
VmHWM growth over training against headroom's peak RSS of the whole process (which includes
the binary, the corpus and the allocator's reserve), so the memory ratio is conservative.

Why the rounds are interleaved and the machine's load is measured: on a shared machine, other
work slows the two sides differently (PyTorch's OpenMP threads lose more to contention than
headroom's rayon pool does), so a ratio measured under load flatters headroom. Every run
records the load average before and after and the CPU time that other processes (and, on a
virtual machine, the hypervisor: "steal") took while it ran. A run during which others took
more than --max-foreign-load cores is repeated (--retries times); if it stays busy, the script
reports nothing and exits with status 3. Within a round the two sides alternate which goes
first and the modes rotate, so a slow minute does not always hit the same side or mode.

Example (the issue-18 GPT, 2 threads each; see docs/benchmarks.md):
  cargo build --release -p headroom
  ~/venvs/torch/bin/python benches/pytorch/side_by_side.py --rounds 3 \\
      --layers 6 --width 384 --heads 6 --seq-len 256 --micro-batch 16 --steps 20
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
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
MIN_ROUNDS = 3
BUSY_EXIT = 3


class Busy(Exception):
    """The machine stayed busy with other work: no ratio may be reported."""


def cpu_times():
    """Machine-wide busy and steal seconds since boot, from the first line of /proc/stat
    (proc(5): user nice system idle iowait irq softirq steal ...; in USER_HZ ticks)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq) / tick, steal / tick


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measured(run):
    """Runs `run()` and returns its result with the machine's load around it: the 1-minute
    load average before and after, and the cores that processes other than the measured one
    (plus the hypervisor's steal) kept busy while it ran."""
    load_before = os.getloadavg()[0]
    busy0, steal0 = cpu_times()
    own0 = children_cpu_seconds()
    t0 = time.monotonic()
    result = run()
    wall = time.monotonic() - t0
    busy1, steal1 = cpu_times()
    own = children_cpu_seconds() - own0
    foreign = max(0.0, (busy1 - busy0) - own) + (steal1 - steal0)
    return result, dict(load_before=load_before, load_after=os.getloadavg()[0],
                        foreign_cores=foreign / wall if wall > 0 else 0.0, wall_s=wall)


def quiet(args, run, what):
    """`measured(run)`, repeated while other work took more than --max-foreign-load cores."""
    for attempt in range(args.retries + 1):
        result, load = measured(run)
        if load["foreign_cores"] <= args.max_foreign_load:
            return result, load
        print(f"  {what}: others kept {load['foreign_cores']:.2f} cores busy (limit "
              f"{args.max_foreign_load}); load {load['load_before']:.2f} -> "
              f"{load['load_after']:.2f}; {'again' if attempt < args.retries else 'giving up'}",
              file=sys.stderr, flush=True)
        time.sleep(args.settle_s)
    raise Busy(f"{what} ran on a busy machine {args.retries + 1} times")


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


def round_plan(modes, rnd):
    """The order of one round (1-based): the modes rotated by the round, and within each mode
    PyTorch first on odd rounds, headroom first on even ones."""
    k = (rnd - 1) % len(modes)
    rotated = modes[k:] + modes[:k]
    return [(mode, "torch" if rnd % 2 else "headroom") for mode in rotated]


def summary(rows, modes):
    """Per mode: the median speed and memory ratios over the rounds, with their range."""
    out = []
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        speed = [r["speed_ratio"] for r in mine]
        memory = [r["memory_ratio"] for r in mine]
        out.append(dict(mode=mode, rounds=len(mine), speed_ratio_median=statistics.median(speed),
                        speed_ratio_min=min(speed), speed_ratio_max=max(speed),
                        memory_ratio_median=statistics.median(memory),
                        max_foreign_cores=max(max(r["torch_load"]["foreign_cores"],
                                                  r["headroom_load"]["foreign_cores"])
                                              for r in mine)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--headroom", default="target/release/headroom",
                    help="the headroom binary (default: %(default)s)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS,
                    help=f"rounds of every mode; at least {MIN_ROUNDS} for a reported median "
                         "(default: %(default)s)")
    ap.add_argument("--exploratory", action="store_true",
                    help=f"allow fewer than {MIN_ROUNDS} rounds; the table is then marked as "
                         "not a result")
    ap.add_argument("--max-foreign-load", type=float, default=0.25,
                    help="cores that other processes may keep busy during a run before it is "
                         "repeated (default: %(default)s)")
    ap.add_argument("--retries", type=int, default=2,
                    help="repeats of a run measured on a busy machine before giving up "
                         "(default: %(default)s)")
    ap.add_argument("--settle-s", type=float, default=20.0,
                    help="seconds to wait before repeating a busy run (default: %(default)s)")
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
    if args.rounds < MIN_ROUNDS and not args.exploratory:
        ap.error(f"--rounds {args.rounds}: a ratio is the median of at least {MIN_ROUNDS} "
                 "interleaved rounds (or pass --exploratory for a quick look that is not a result)")
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    if not Path(args.headroom).is_file():
        ap.error(f"no headroom binary at {args.headroom}: run `cargo build --release -p headroom`"
                 " or pass --headroom PATH")

    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t_out, h_out = Path(tmp) / "torch.json", Path(tmp) / "headroom.json"
            for rnd in range(1, args.rounds + 1):
                for mode, first in round_plan(modes, rnd):
                    torch_extra, headroom_extra = MODES[mode]
                    sides = {
                        "torch": lambda: quiet(args, lambda: run_torch(args, torch_extra, t_out),
                                               f"round {rnd} {mode} PyTorch"),
                        "headroom": lambda: quiet(
                            args, lambda: run_headroom(args, headroom_extra, h_out),
                            f"round {rnd} {mode} headroom"),
                    }
                    order = [first, "headroom" if first == "torch" else "torch"]
                    got = {side: sides[side]() for side in order}
                    (t_tps, t_mem, t_loss), t_load = got["torch"]
                    (h_tps, h_mem, h_loss), h_load = got["headroom"]
                    rows.append(dict(round=rnd, mode=mode, first=first,
                                     torch_tokens_per_s=t_tps, headroom_tokens_per_s=h_tps,
                                     speed_ratio=h_tps / t_tps,
                                     torch_peak_rss_growth_bytes=t_mem,
                                     headroom_peak_rss_bytes=h_mem, memory_ratio=h_mem / t_mem,
                                     torch_final_loss=t_loss, headroom_final_loss=h_loss,
                                     torch_load=t_load, headroom_load=h_load))
                    r = rows[-1]
                    print(f"round {rnd} {mode:<10} PyTorch {t_tps:>8,.0f} tok/s  headroom "
                          f"{h_tps:>8,.0f} tok/s  ratio {r['speed_ratio']:.2f}x  memory "
                          f"{t_mem / 2**20:,.0f} -> {h_mem / 2**20:,.0f} MiB "
                          f"({r['memory_ratio']:.2f}x)  load {t_load['load_before']:.2f}/"
                          f"{h_load['load_after']:.2f}, others "
                          f"{max(t_load['foreign_cores'], h_load['foreign_cores']):.2f} cores",
                          flush=True)
    except Busy as e:
        print(f"error: {e}: no ratio reported. Measure on a quiet machine (nothing else "
              "running; on a shared virtual machine, a quieter hour), or raise "
              "--max-foreign-load and say so next to the figures.", file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps(dict(busy=str(e), rows=rows), indent=2) + "\n")
        sys.exit(BUSY_EXIT)

    table = summary(rows, modes)
    label = " (exploratory: fewer than 3 rounds, not a result)" if args.rounds < MIN_ROUNDS else ""
    print(f"\nmedian over {args.rounds} interleaved rounds{label}")
    for s in table:
        print(f"{s['mode']:<10} speed {s['speed_ratio_median']:.2f}x "
              f"({s['speed_ratio_min']:.2f}-{s['speed_ratio_max']:.2f})  memory "
              f"{s['memory_ratio_median']:.2f}x  others at most {s['max_foreign_cores']:.2f} cores")
    if args.json:
        args.json.write_text(json.dumps(dict(rounds=rows, summary=table,
                                             exploratory=args.rounds < MIN_ROUNDS),
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
