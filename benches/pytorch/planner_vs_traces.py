"""The analytical planner (`headroom plan`) against headroom's tracer on the same settings.

The tracer (`headroom.trace`) runs two training steps of a Hugging Face model under
`FakeTensorMode` with the CUDA kernels' allocations emulated (device "cuda", sm90) and records
every storage; the planner predicts the same run from formulas. Both give the peak and each
category's bytes at that peak, so the planner's error can be read per category:

    .venv/bin/python benches/pytorch/planner_vs_traces.py                 # every setting
    .venv/bin/python benches/pytorch/planner_vs_traces.py --only llama    # names containing it
    .venv/bin/python benches/pytorch/planner_vs_traces.py --json out.json # and the raw figures

Settings: the eight small configs of `memtracker_compare.py` (GPT-2 with vocabularies 50,257
and 8,192, Llama with grouped-query attention and vocabularies 32,000 and 128,256, Mistral,
Qwen2 with a tied 151,936 vocabulary, Gemma, Phi-3) × fp32, pure bf16 and bf16 autocast ×
gradient checkpointing off and on × three batch shapes (2 × 512, 4 × 1024, 8 × 256): 144
settings, SDPA attention (transformers' default), AdamW foreach, the causal-LM loss.

Both sides leave out `other` (the CUDA context, the cuBLAS workspace and the fragmentation
reserve in the plan; the workspaces and buffers in the trace). The trace's bytes are requested
sizes (no allocator rounding), the moment of its largest total less `other`; the plan's are its
`by_category` at its predicted peak. Needs the release or debug binary (`cargo build -p
headroom`) and the repository's .venv (torch, transformers, the headroom package).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "crates" / "plan" / "tests" / "data" / "memtracker"
MIB = 1024 * 1024

MODELS = [
    "gpt2-256-v50k", "gpt2-512-v8k", "llama-gqa-512-v32k", "llama-gqa-768-v128k",
    "mistral-512-v32k", "qwen2-512-v152k", "gemma-512-v32k", "phi3-512-v32k",
]
DTYPES = {"fp32": "fp32", "bf16": "bf16", "bf16-autocast": "bf16-mixed"}
SHAPES = [(2, 512), (4, 1024), (8, 256)]
# The planner's categories, and the tracer's that count towards each.
CATEGORIES = {
    "parameter": ["parameter"],
    "gradient": ["gradient"],
    "optimizer_state": ["optimizer_state"],
    "activation": ["activation", "input"],
    "temporary": ["temporary"],
}


def settings() -> list[dict]:
    out = []
    for model in MODELS:
        for dtype in DTYPES:
            for ckpt in (False, True):
                for b, s in SHAPES:
                    name = f"{model}/{dtype}/{'ckpt' if ckpt else 'nockpt'}/b{b}s{s}"
                    out.append(dict(name=name, model=model, dtype=dtype, checkpoint=ckpt,
                                    micro_batch=b, seq_len=s))
    return out


def traced_peak(events: list[dict]) -> tuple[int, dict]:
    """The largest total of live requested bytes other than `other` and each category's bytes
    at that moment. `other` is left out when finding the moment, as the plan leaves it out of
    its peak: a matmul's 32 MiB cuBLAS workspace, made and freed within its call, would
    otherwise move a small model's peak to whichever matmul has the most live."""
    live: dict = {}
    by: dict = {}
    total = 0
    best = (0, {})
    for e in events:
        if e["action"] == "alloc" and e["category"] == "other":
            continue
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e["category"])
            by[e["category"]] = by.get(e["category"], 0) + e["size"]
            total += e["size"]
            if total > best[0]:
                best = (total, dict(by))
        elif e["action"] == "free" and e["addr"] in live:
            size, cat = live.pop(e["addr"])
            by[cat] -= size
            total -= size
    return best


def plan(binary: Path, st: dict) -> dict:
    args = [
        str(binary), "plan", "--model", str(CONFIGS / f"{st['model']}.json"),
        "--gpu", "H100-80GB", "--precision", DTYPES[st["dtype"]],
        "--micro-batch", str(st["micro_batch"]), "--seq-len", str(st["seq_len"]),
        "--checkpoint", "all" if st["checkpoint"] else "none",
        "--attention", "memory-efficient", "--optimizer", "adamw", "--optimizer-impl", "foreach",
        "--zero", "0", "--offload-optimizer", "none", "--offload-params", "none",
        "--offload-activations", "none", "--framework", "fsdp", "--loss", "plain",
        "--loss-impl", "hugging-face", "--optimizer-in-backward", "false",
        "--accumulation", "1", "--json",
    ]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{st['name']}: headroom plan failed:\n{out.stderr}")
    return json.loads(out.stdout)["plans"][0]["memory"]


def distribution(label: str, errs: list[float]) -> str:
    absolute = sorted(abs(e) for e in errs)
    p90 = absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))]
    return (f"| {label} | {len(errs)} | {100 * statistics.mean(absolute):.1f} % | "
            f"{100 * statistics.median(absolute):.1f} % | {100 * p90:.1f} % | "
            f"{100 * absolute[-1]:.1f} % | {100 * statistics.mean(errs):+.1f} % |")


def summarise(rows: list[dict]) -> None:
    """The error distributions: the peak less `other` by precision, then each category at the
    peak. Under autocast the plan counts the 16-bit weight casts autocast keeps for backward
    with the parameters and the tracer with the activations (they are allocated in forward and
    saved), so for those settings the two are compared together."""
    def err(r, cat):
        return (r["planned"][cat] - r["traced"][cat]) / r["traced"][cat]

    print("| peak less other | settings | mean \\|error\\| | median | 90th pct | worst | signed mean |")
    print("|---|---|---|---|---|---|---|")
    print(distribution("all", [err(r, "total") for r in rows]))
    for dtype in DTYPES:
        sel = [r for r in rows if r["setting"]["dtype"] == dtype]
        if sel:
            print(distribution(dtype, [err(r, "total") for r in sel]))
    print()
    print("| category at the peak (counted where the trace holds ≥ 1 % of it) | settings | mean \\|error\\| | median | 90th pct | worst | signed mean |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        for side in ("traced", "planned"):
            r[side]["parameter + activation"] = r[side]["parameter"] + r[side]["activation"]
    plain = [r for r in rows if r["setting"]["dtype"] != "bf16-autocast"]
    autocast = [r for r in rows if r["setting"]["dtype"] == "bf16-autocast"]
    for label, sel, cats in (
        ("fp32 and pure bf16", plain, list(CATEGORIES)),
        ("bf16 autocast", autocast,
         ["parameter + activation", "gradient", "optimizer_state", "temporary"]),
    ):
        for cat in cats:
            errs = [err(r, cat) for r in sel if r["traced"][cat] >= 0.01 * r["traced"]["total"]]
            if errs:
                print(distribution(f"{cat} ({label})", errs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run the settings whose name contains this")
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "headroom"))
    parser.add_argument("--json", help="write every setting's figures here")
    parser.add_argument("--from-json", help="print the tables of an earlier --json file")
    args = parser.parse_args()
    if args.from_json:
        summarise(json.loads(Path(args.from_json).read_text()))
        return 0
    binary = Path(args.binary)
    if not binary.exists():
        binary = ROOT / "target" / "debug" / "headroom"
    import headroom

    rows = []
    started = time.time()
    for st in settings():
        if args.only and args.only not in st["name"]:
            continue
        events = headroom.trace(str(CONFIGS / f"{st['model']}.json"), seq_len=st["seq_len"],
                                micro_batch=st["micro_batch"], steps=2, dtype=st["dtype"],
                                gradient_checkpointing=st["checkpoint"], device="cuda")
        peak, at = traced_peak(events)
        mem = plan(binary, st)
        traced = {c: sum(at.get(t, 0) for t in ts) for c, ts in CATEGORIES.items()}
        planned = {c: mem["by_category"].get(c, 0) + (mem["by_category"].get("master_weight", 0)
                                                      if c == "parameter" else 0)
                   for c in CATEGORIES}
        traced["total"] = peak
        planned["total"] = mem["per_device_peak_bytes"] - mem["by_category"]["other"]
        rows.append(dict(setting=st, traced=traced, planned=planned))
        err = (planned["total"] - traced["total"]) / traced["total"]
        print(f"{st['name']:48s} traced {traced['total'] / MIB:8.1f} MiB  planned "
              f"{planned['total'] / MIB:8.1f} MiB  {100 * err:+6.1f} %", flush=True)
    print(f"\n{len(rows)} settings in {time.time() - started:.0f} s\n")
    summarise(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
