"""headroom's tracer against PyTorch's MemTracker on the same program: per-category peak bytes.

Both run the same training program on the same model: a Hugging Face config built under
`FakeTensorMode` (no weights, no GPU) with its language-modelling head, a batch of random token
ids used as the labels too, the model's own loss, `torch.optim.AdamW(foreach=True)`, two steps of
forward, backward, `step()` and `zero_grad(set_to_none=True)`. MemTracker
(`torch.distributed._tools.mem_tracker.MemTracker`, a TorchDispatchMode with module, gradient and
optimizer hooks) counts its categories live after every op; headroom's tracer
(`headroom.trace(..., device="cpu")`, so both run the same CPU kernels) writes alloc and free
events, replayed here into the same categories. Each category's peak is the most bytes it held at
any point of the two steps.

    .venv/bin/python benches/pytorch/tracer_vs_memtracker.py           # all settings, the table
    .venv/bin/python benches/pytorch/tracer_vs_memtracker.py --only llama

The categories map as follows (MemTracker's definitions are `_MemRefType` in
torch/distributed/_tools/mem_tracker.py; MemTracker decides by the phase an op runs in,
the tracer by what a storage is used for):

| MemTracker | headroom trace events |
|---|---|
| Parameter | parameter |
| Buffer | other (the model's buffers; a CPU trace has no cuBLAS workspace) |
| Gradient | gradient, except for the one sample right after its alloc (see below) |
| Activation | activation, input, and temporary allocated in the forward pass |
| Temp | temporary allocated in the backward pass |
| Optstate | optimizer_state, and temporary allocated in the optimizer step |

MemTracker learns that a storage is a gradient from the gradient hooks, which run after the op
that made it returned, so at the sample taken after that op it is still Temp; the replay counts
a gradient's bytes as Temp in the sample right after its alloc, and as Gradient from the next
event on; MemTracker's hooks run when the autograd node that made the gradient returns, so when
that node also computes its input's gradient after the parameter's (Mixtral's LM head), the two
count as Temp together for MemTracker, one after the other for the replay. A checkpoint's
recomputation runs in the backward pass: MemTracker counts it as Activation (`_in_ac`), the
replay as Temp; in these settings neither peak moves, as the Activation peak is at the end of
the forward pass and the Temp peak at the LM head's backward, before any recomputation.

MemTracker's module tracker (torch/distributed/_tools/mod_tracker.py) registers
`torch.autograd.graph.register_multi_grad_hook(mode="all")` on each module's inputs, which holds
the gradients that arrive first until the last one does; a program without the tracker frees
them sooner. `--release-held-gradients` runs MemTracker with those hooks in mode "any" (which
holds nothing), to show which differences that buffering makes.

`--cuda` also traces each setting with `device="cuda"` and prints what the CUDA kernels change
(see docs/python.md, "CUDA kernels on a CPU trace").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
# The checkout's `headroom` when its extension is built in place (maturin develop), else the
# installed one.
if any((ROOT / "python" / "headroom").glob("_headroom*.so")):
    sys.path.insert(0, str(ROOT / "python"))

MIB = 1024 * 1024
CATEGORIES = ("Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate")

# Small configs of each family (a few MB of parameters: each setting runs in seconds).
MODELS: dict[str, dict[str, Any]] = {
    "gpt2": dict(model_type="gpt2", n_embd=128, n_head=4, n_layer=2, vocab_size=4096,
                 n_positions=512, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": dict(model_type="llama", hidden_size=128, intermediate_size=344,
                  num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                  vocab_size=4096, max_position_embeddings=512, tie_word_embeddings=False),
    "mistral": dict(model_type="mistral", hidden_size=128, intermediate_size=448,
                    num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                    vocab_size=4096, sliding_window=None, max_position_embeddings=512,
                    tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", hidden_size=128, intermediate_size=384,
                  num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                  vocab_size=6144, max_position_embeddings=512, tie_word_embeddings=True),
    "gemma": dict(model_type="gemma", hidden_size=128, intermediate_size=512,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                  num_hidden_layers=2, vocab_size=4096, max_position_embeddings=512),
    "phi3": dict(model_type="phi3", hidden_size=128, intermediate_size=384,
                 num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
                 vocab_size=4096, max_position_embeddings=512,
                 original_max_position_embeddings=512, rope_scaling=None, pad_token_id=0,
                 bos_token_id=1, eos_token_id=2,
                 tie_word_embeddings=False),
    "bert": dict(model_type="bert", hidden_size=128, intermediate_size=512,
                 num_attention_heads=4, num_hidden_layers=2, vocab_size=4096,
                 max_position_embeddings=512, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0),
    "t5": dict(model_type="t5", d_model=128, d_kv=32, d_ff=512, num_heads=4, num_layers=2,
               num_decoder_layers=2, vocab_size=4096, dropout_rate=0.0,
               decoder_start_token_id=0, pad_token_id=0),
    "mixtral": dict(model_type="mixtral", hidden_size=128, intermediate_size=256,
                    num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                    vocab_size=4096, num_local_experts=4, num_experts_per_tok=2,
                    max_position_embeddings=512, tie_word_embeddings=False),
}


def setting(model: str, dtype: str, checkpoint: bool, micro_batch: int, seq_len: int) -> dict:
    name = f"{model}/{dtype}/{'ckpt' if checkpoint else 'nockpt'}/b{micro_batch}s{seq_len}"
    return dict(name=name, model=model, dtype=dtype, checkpoint=checkpoint,
                micro_batch=micro_batch, seq_len=seq_len)


# dtype: fp32, bf16 (pure: the model cast to bf16), bf16-autocast (fp32 model, CPU autocast).
SETTINGS = [
    setting("gpt2", "fp32", False, 4, 128),
    setting("gpt2", "fp32", True, 4, 128),
    setting("gpt2", "bf16-autocast", False, 2, 256),
    setting("llama", "fp32", False, 4, 128),
    setting("llama", "fp32", True, 4, 128),
    setting("llama", "bf16", False, 2, 256),
    setting("llama", "bf16-autocast", True, 2, 128),
    setting("mistral", "fp32", False, 2, 128),
    setting("mistral", "bf16-autocast", False, 2, 128),
    setting("qwen2", "fp32", False, 2, 128),
    setting("qwen2", "bf16", True, 2, 256),
    setting("gemma", "fp32", False, 2, 128),
    setting("gemma", "bf16-autocast", True, 2, 128),
    setting("phi3", "fp32", False, 2, 128),
    setting("phi3", "bf16", True, 2, 128),
    setting("bert", "fp32", False, 4, 128),
    setting("bert", "fp32", True, 4, 128),
    setting("bert", "bf16-autocast", False, 2, 128),
    setting("t5", "fp32", False, 2, 128),
    setting("t5", "fp32", True, 2, 128),
    setting("t5", "bf16", False, 2, 128),
    setting("mixtral", "fp32", False, 2, 64),
    setting("mixtral", "bf16-autocast", True, 2, 64),
]


def _key(k: Any) -> str:
    return str(getattr(k, "value", k))


def memtracker_peaks(config: dict, st: dict, release_held_gradients: bool = False
                     ) -> tuple[dict[str, int], int]:
    """MemTracker's peak of each category over two steps, and its peak total."""
    import torch
    import torch.distributed._tools.mod_tracker as mod_tracker
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM,
                              AutoModelForSeq2SeqLM)

    class Tracker(MemTracker):
        """MemTracker that keeps each category's own peak (it keeps the breakdown at the
        peak total only)."""

        def __init__(self) -> None:
            super().__init__()
            self.own_peaks: dict[str, int] = {}

        def _update_peak_stats(self, peak_state: Any) -> None:
            super()._update_peak_stats(peak_state)
            for snap in self._curr_mem_snap.values():
                for k, v in snap.items():
                    self.own_peaks[_key(k)] = max(self.own_peaks.get(_key(k), 0), v)

    kw = dict(config)
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    auto = {"t5": AutoModelForSeq2SeqLM, "bert": AutoModelForMaskedLM}.get(
        cfg.model_type, AutoModelForCausalLM)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = auto.from_config(cfg, dtype=torch.bfloat16 if st["dtype"] == "bf16" else None)
        model.train()
        if st["checkpoint"]:
            model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False})
        optim = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        mt = Tracker()
        mt.track_external(model, optim)
        hold = mod_tracker.register_multi_grad_hook
        if release_held_gradients:
            mod_tracker.register_multi_grad_hook = (  # type: ignore[assignment]
                lambda tensors, fn, mode="all": hold(tensors, fn, mode="any"))
        try:
            _steps(mt, model, optim, cfg.vocab_size, st)
        finally:
            mod_tracker.register_multi_grad_hook = hold
        peak = next(iter(mt.get_tracker_snapshot("peak").values()))
    own = {k: v for k, v in mt.own_peaks.items() if k in CATEGORIES}
    return own, int(peak["Total"])


def _steps(mt: Any, model: Any, optim: Any, vocab_size: int, st: dict) -> None:
    """Two training steps under the tracker: the program both sides run."""
    import torch

    with mt:
        # MemTracker refuses a second forward of the same modules without a reset between.
        train_steps(model, optim, vocab_size, st, "cpu", after_first=mt.reset_mod_stats)


def train_steps(model: Any, optim: Any, vocab_size: int, st: dict, device: str,
                after_first: Optional[Any] = None) -> None:
    """The program every side runs: two steps of forward with the labels (under `device`'s
    bf16 autocast for bf16-autocast settings), backward, `step()` and `zero_grad()`."""
    import torch

    for i in range(2):
        ids = torch.randint(0, vocab_size, (st["micro_batch"], st["seq_len"]), device=device)
        if st["dtype"] == "bf16-autocast":
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
        else:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        del loss
        optim.step()
        optim.zero_grad(set_to_none=True)
        del ids
        if i == 0 and after_first is not None:
            after_first()


def memtracker_category(event: dict) -> str:
    """The MemTracker category of a trace event's storage (see the module's doc)."""
    category, phase = event["category"], event["phase"]
    if category == "parameter":
        return "Parameter"
    if category == "other":
        return "Buffer"
    if category == "gradient":
        return "Gradient"
    if category == "optimizer_state":
        return "Optstate"
    if category in ("activation", "input"):
        return "Activation"
    if phase == "optimizer":
        return "Optstate"
    if phase == "backward":
        return "Temp"
    return "Activation"


def trace_peaks(events: list[dict]) -> tuple[dict[str, int], int]:
    """Replays the events: each MemTracker category's peak, and the peak total."""
    live: dict[int, tuple[str, int]] = {}
    held = dict.fromkeys(CATEGORIES, 0)
    peaks = dict.fromkeys(CATEGORIES, 0)
    total = peak_total = 0
    for e in events:
        if e["action"] == "alloc":
            cat = memtracker_category(e)
            live[e["addr"]] = (cat, e["size"])
            total += e["size"]
            peak_total = max(peak_total, total)
            # A gradient is Temp to MemTracker until its hook runs, after the op.
            sampled = "Temp" if cat == "Gradient" and e["phase"] == "backward" else cat
            held[sampled] += e["size"]
            peaks[sampled] = max(peaks[sampled], held[sampled])
            if sampled != cat:
                held[sampled] -= e["size"]
                held[cat] += e["size"]
                peaks[cat] = max(peaks[cat], held[cat])
        elif e["action"] == "free":
            cat, size = live.pop(e["addr"])
            held[cat] -= size
            total -= size
    return peaks, peak_total


def trace_events(config: dict, st: dict, device: str) -> list[dict]:
    import headroom

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config))
        return headroom.trace(path, micro_batch=st["micro_batch"], seq_len=st["seq_len"],
                              steps=2, dtype=st["dtype"], optimizer_impl="foreach",
                              gradient_checkpointing=st["checkpoint"], device=device)


def compare(st: dict, release_held_gradients: bool = False,
            config: Optional[dict] = None) -> dict:
    """One setting on both sides; `config` replaces the model's config of `MODELS`."""
    config = config or MODELS[st["model"]]
    reference, reference_total = memtracker_peaks(config, st, release_held_gradients)
    traced, traced_total = trace_peaks(trace_events(config, st, "cpu"))
    return dict(st, memtracker=reference, memtracker_total=reference_total, trace=traced,
                trace_total=traced_total)


def relative(a: int, b: int) -> float:
    """(a - b) / b, 0 when both are 0."""
    return 0.0 if a == b else (a - b) / max(b, 1)


def worst(row: dict) -> tuple[str, float]:
    errors = {c: relative(row["trace"][c], row["memtracker"].get(c, 0)) for c in CATEGORIES}
    errors["Total"] = relative(row["trace_total"], row["memtracker_total"])
    cat = max(errors, key=lambda c: abs(errors[c]))
    return cat, errors[cat]


def cuda_difference(st: dict) -> dict[str, int]:
    """What `device="cuda"` changes in each trace category's peak against `device="cpu"`."""
    from collections import defaultdict

    def peaks(events: list[dict]) -> dict[str, int]:
        live: dict[int, tuple[str, int]] = {}
        held: dict[str, int] = defaultdict(int)
        best: dict[str, int] = defaultdict(int)
        for e in events:
            if e["action"] == "alloc":
                live[e["addr"]] = (e["category"], e["size"])
                held[e["category"]] += e["size"]
                best[e["category"]] = max(best[e["category"]], held[e["category"]])
            elif e["action"] == "free":
                cat, size = live.pop(e["addr"])
                held[cat] -= size
        return best

    config = MODELS[st["model"]]
    cpu, cuda = peaks(trace_events(config, st, "cpu")), peaks(trace_events(config, st, "cuda"))
    return {c: cuda.get(c, 0) - cpu.get(c, 0) for c in sorted(set(cpu) | set(cuda))
            if cuda.get(c, 0) != cpu.get(c, 0)}


def markdown(rows: list[dict]) -> str:
    """The rows as the table of docs/benchmarks.md."""
    head = " | ".join(f"{c} MiB" for c in CATEGORIES)
    lines = [f"| setting | {head} | largest difference | `cuda` − `cpu` trace, per category's peak |",
             "|---" * (len(CATEGORIES) + 3) + "|"]
    for r in rows:
        cells = " | ".join(f"{r['memtracker'].get(c, 0) / MIB:.3f}" for c in CATEGORIES)
        cat, err = worst(r)
        diff = r["trace"][cat] - r["memtracker"].get(cat, 0) if cat != "Total" else (
            r["trace_total"] - r["memtracker_total"])
        cuda = ", ".join(f"{k} {v:+,} B" for k, v in r.get("cuda_minus_cpu", {}).items()) or "—"
        lines.append(f"| `{r['name']}` | {cells} | {cat} {diff:+,} B ({100 * err:+.3f} %) | {cuda} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run only settings whose name contains this")
    ap.add_argument("--cuda", action="store_true",
                    help="also print what device='cuda' changes in each category's peak")
    ap.add_argument("--release-held-gradients", action="store_true",
                    help="run MemTracker's module hooks in mode 'any' (see the module's doc)")
    ap.add_argument("--json", type=Path, help="write the rows as JSON here")
    ap.add_argument("--markdown", type=Path, help="write the rows as a Markdown table here")
    args = ap.parse_args()
    rows = []
    head = " ".join(f"{c:>10s}" for c in CATEGORIES)
    print(f"{'setting':34s} {head} {'worst':>16s}   (MemTracker MiB / trace - MemTracker)")
    for st in SETTINGS:
        if args.only and args.only not in st["name"]:
            continue
        t0 = time.time()
        row = compare(st, args.release_held_gradients)
        if args.cuda:
            row["cuda_minus_cpu"] = cuda_difference(st)
        rows.append(row)
        cat, err = worst(row)
        cells = " ".join(f"{row['memtracker'].get(c, 0) / MIB:10.3f}" for c in CATEGORIES)
        print(f"{st['name']:34s} {cells} {cat:>9s} {100 * err:+6.2f}%  ({time.time() - t0:.1f} s)",
              flush=True)
        if args.cuda:
            print(f"{'':34s} cuda - cpu: {row['cuda_minus_cpu']}")
    if not rows:
        return 1
    overall = max((abs(worst(r)[1]), r["name"], worst(r)[0]) for r in rows)
    print(f"\n{len(rows)} settings; worst per-category difference {100 * overall[0]:.3f} % "
          f"({overall[2]} of {overall[1]})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
