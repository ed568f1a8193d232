#!/usr/bin/env python3
"""headroom against PyTorch on the same CPU, in one run: each mode trains the same model with
PyTorch and with `headroom train`, the two interleaved, for at least three rounds; the table
gives the median ratio headroom/PyTorch for tokens/s and for peak memory.

Models (--model):
  gpt     headroom's gpt-small family (--layers --width --heads) against `gpt_peer.py`
  llama   a Llama (--layers --width --heads --kv-heads --ffn; vocab 256, untied head): the
          script writes its Hugging Face config.json into a temporary directory that both sides
          read, `llama_peer.py` (transformers' LlamaForCausalLM; naive attention is its "eager"
          implementation, sdpa its "sdpa") and `headroom train --model DIR` (no weights there:
          both initialise afresh, each from its own generator; see llama_peer.py for what is
          and is not identical). The first and last training losses of both sides are printed
          per run: at step 1 both sit near ln(256) = 5.545.

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

Examples (2 threads each; see docs/benchmarks.md):
  cargo build --release -p headroom
  # the issue-18 GPT
  ~/venvs/torch/bin/python benches/pytorch/side_by_side.py --rounds 3 \\
      --layers 6 --width 384 --heads 6 --seq-len 256 --micro-batch 16 --steps 20
  # a Llama of 9,638,784 parameters (6 layers, width 384, 6 heads over 2 KV heads, ffn 1024)
  ~/venvs/torch/bin/python benches/pytorch/side_by_side.py --model llama --rounds 3 \\
      --layers 6 --width 384 --heads 6 --kv-heads 2 --ffn 1024 --seq-len 256 \\
      --micro-batch 8 --steps 20 --modes fp32-naive,fp32-sdpa,bf16
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


def llama_ffn(width):
    """Llama's default MLP width: 8/3 of the model width, rounded up to a multiple of 64."""
    return -(-8 * width // (3 * 64)) * 64


def llama_config(args):
    """The Hugging Face config.json of the --model llama shape, read by both sides."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 256,
        "max_position_embeddings": args.seq_len,
        "num_hidden_layers": args.layers,
        "hidden_size": args.width,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "intermediate_size": args.ffn,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    }


def peers(args, tmp):
    """(the PyTorch command before its mode flags, headroom's model flags) for --model. For the
    Llama the shape is the config.json written into `tmp`, which both sides read; headroom gets
    no shape flag then (--layers/--width/--heads are the GPT's)."""
    batch = ["--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch)]
    if args.model == "gpt":
        shape = ["--layers", str(args.layers), "--width", str(args.width), "--heads",
                 str(args.heads)]
        return ([sys.executable, str(HERE / "gpt_peer.py"), *shape, *batch],
                ["--model", "gpt-small", *shape, *batch])
    model_dir = Path(tmp) / "llama"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(llama_config(args), indent=2) + "\n")
    return ([sys.executable, str(HERE / "llama_peer.py"), "--config",
             str(model_dir / "config.json"), *batch],
            ["--model", str(model_dir), *batch])


def run_torch(args, base, extra, out):
    cmd = [*base, "--steps", str(args.steps), "--threads", str(args.threads), *extra,
           "--json", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    r = json.loads(out.read_text())
    return dict(tokens_per_s=r["tokens_per_s"], memory=r["peak_rss_growth_bytes"],
                first_loss=r["train_losses"][0], final_loss=r["final_train_loss"],
                parameters=r["parameters"])


def run_headroom(args, model, extra, out):
    cmd = [args.headroom, "train", *model, "--accumulation", "1", "--optimizer", "adamw",
           "--no-auto", "--steps", str(args.steps), "--eval-every", "0", "--no-timeline",
           "--device-memory", args.device_memory, *extra, "--json-report", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "RAYON_NUM_THREADS": str(args.threads)})
    r = json.loads(out.read_text())
    times = r["step_times_s"][WARM_UP:] or r["step_times_s"]
    tokens = args.micro_batch * args.seq_len
    return dict(tokens_per_s=tokens * len(times) / sum(times), memory=r["host"]["peak_rss_bytes"],
                first_loss=r["losses"][0], final_loss=r["losses"][-1],
                mean_step_ms=1e3 * sum(times) / len(times))


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
    ap.add_argument("--model", choices=["gpt", "llama"], default="gpt",
                    help="gpt: headroom's gpt-small family against gpt_peer.py; llama: a "
                         "LlamaForCausalLM config.json both sides read (default: %(default)s)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int,
                    help="llama only: key/value heads (grouped-query attention; default: --heads)")
    ap.add_argument("--ffn", type=int,
                    help="llama only: the SwiGLU's intermediate size (default: 8/3 of --width "
                         "rounded up to a multiple of 64)")
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
    if args.model == "gpt":
        if args.kv_heads is not None or args.ffn is not None:
            ap.error("--kv-heads and --ffn shape a Llama: pass --model llama")
    else:
        args.kv_heads = args.heads if args.kv_heads is None else args.kv_heads
        args.ffn = llama_ffn(args.width) if args.ffn is None else args.ffn
        if args.width % args.heads or args.heads % args.kv_heads:
            ap.error(f"--width {args.width}, --heads {args.heads}, --kv-heads {args.kv_heads}: "
                     "the width must be a multiple of the heads, the heads of the KV heads")
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
            torch_base, headroom_model = peers(args, tmp)
            for rnd in range(1, args.rounds + 1):
                for mode, first in round_plan(modes, rnd):
                    torch_extra, headroom_extra = MODES[mode]
                    sides = {
                        "torch": lambda: quiet(
                            args, lambda: run_torch(args, torch_base, torch_extra, t_out),
                            f"round {rnd} {mode} PyTorch"),
                        "headroom": lambda: quiet(
                            args, lambda: run_headroom(args, headroom_model, headroom_extra,
                                                       h_out),
                            f"round {rnd} {mode} headroom"),
                    }
                    order = [first, "headroom" if first == "torch" else "torch"]
                    got = {side: sides[side]() for side in order}
                    t, t_load = got["torch"]
                    h, h_load = got["headroom"]
                    rows.append(dict(round=rnd, mode=mode, first=first,
                                     parameters=t["parameters"],
                                     torch_tokens_per_s=t["tokens_per_s"],
                                     headroom_tokens_per_s=h["tokens_per_s"],
                                     speed_ratio=h["tokens_per_s"] / t["tokens_per_s"],
                                     torch_peak_rss_growth_bytes=t["memory"],
                                     headroom_peak_rss_bytes=h["memory"],
                                     memory_ratio=h["memory"] / t["memory"],
                                     torch_first_loss=t["first_loss"],
                                     headroom_first_loss=h["first_loss"],
                                     torch_final_loss=t["final_loss"],
                                     headroom_final_loss=h["final_loss"],
                                     torch_load=t_load, headroom_load=h_load))
                    r = rows[-1]
                    print(f"round {rnd} {mode:<10} PyTorch {t['tokens_per_s']:>8,.0f} tok/s  "
                          f"headroom {h['tokens_per_s']:>8,.0f} tok/s  ratio "
                          f"{r['speed_ratio']:.2f}x  memory {t['memory'] / 2**20:,.0f} -> "
                          f"{h['memory'] / 2**20:,.0f} MiB ({r['memory_ratio']:.2f}x)  loss "
                          f"{t['first_loss']:.3f}->{t['final_loss']:.3f} / "
                          f"{h['first_loss']:.3f}->{h['final_loss']:.3f}  load "
                          f"{t_load['load_before']:.2f}/{h_load['load_after']:.2f}, others "
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
    print(f"\n{args.model}, {rows[0]['parameters']:,} parameters: median over {args.rounds} "
          f"interleaved rounds{label}")
    for s in table:
        print(f"{s['mode']:<10} speed {s['speed_ratio_median']:.2f}x "
              f"({s['speed_ratio_min']:.2f}-{s['speed_ratio_max']:.2f})  memory "
              f"{s['memory_ratio_median']:.2f}x  others at most {s['max_foreign_cores']:.2f} cores")
    if args.json:
        args.json.write_text(json.dumps(dict(model=args.model, rounds=rows, summary=table,
                                             exploratory=args.rounds < MIN_ROUNDS),
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
