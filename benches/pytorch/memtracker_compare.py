"""PyTorch's MemTracker against `headroom plan` on small Hugging Face models.

`torch.distributed._tools.mem_tracker.MemTracker` (a TorchDispatchMode with module hooks)
attributes every tensor storage of a training step to a category and records the peak. Run
under `FakeTensorMode` on the CPU it needs no weights and no GPU: two steps of each setting
(forward with the Hugging Face causal-LM loss, backward, foreach AdamW, zero_grad), the
second step measured.

    .venv/bin/python benches/pytorch/memtracker_compare.py            # measure, write the data
    .venv/bin/python benches/pytorch/memtracker_compare.py --check    # plan each, print the table

Measuring writes `crates/plan/tests/data/memtracker/settings.json` (every setting, the tracker's
peak, its breakdown at the peak and each category's own peak) and one config.json per model
beside it; the test `crates/plan/tests/memtracker.rs` plans the same settings from them.
`--check` runs `headroom plan --json` (binary from `cargo build -p headroom`) for each setting
and prints tracker MiB (the CPU peak less `Other`, plus `cuda_correction`: what a CUDA run
allocates differently, see `cuda_correction`), planner MiB (the planned peak less `other`: the
CUDA context and the fragmentation reserve, which a CPU tracker cannot see) and the error.

Settings are chosen where the CPU kernels allocate as CUDA's do (see docs/planner.md, "Against
PyTorch's MemTracker"): SDPA without dropout and without a mask takes the CPU flash kernel,
which like CUDA's flash and memory-efficient kernels saves its output and an fp32 log-sum-exp;
autocast runs use only ops whose CPU and CUDA autocast policies agree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "crates" / "plan" / "tests" / "data" / "memtracker"
MIB = 1024 * 1024

# Small models of each family; dropout off unless a setting asks for it (see `dropout`).
MODELS = {
    "gpt2-256-v50k": dict(model_type="gpt2", n_embd=256, n_head=4, n_layer=4,
                          vocab_size=50257, n_positions=2048),
    "gpt2-512-v8k": dict(model_type="gpt2", n_embd=512, n_head=8, n_layer=3,
                         vocab_size=8192, n_positions=2048),
    "llama-gqa-512-v32k": dict(model_type="llama", hidden_size=512, intermediate_size=1376,
                               num_attention_heads=8, num_key_value_heads=2,
                               num_hidden_layers=3, vocab_size=32000,
                               max_position_embeddings=4096, tie_word_embeddings=False),
    "llama-gqa-768-v128k": dict(model_type="llama", hidden_size=768, intermediate_size=2048,
                                num_attention_heads=12, num_key_value_heads=4,
                                num_hidden_layers=2, vocab_size=128256,
                                max_position_embeddings=4096, tie_word_embeddings=False),
    "mistral-512-v32k": dict(model_type="mistral", hidden_size=512, intermediate_size=1792,
                             num_attention_heads=8, num_key_value_heads=2,
                             num_hidden_layers=3, vocab_size=32768, sliding_window=None,
                             max_position_embeddings=4096, tie_word_embeddings=False),
    "qwen2-512-v152k": dict(model_type="qwen2", hidden_size=512, intermediate_size=1536,
                            num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=2,
                            vocab_size=151936, max_position_embeddings=4096,
                            tie_word_embeddings=True),
    "gemma-512-v32k": dict(model_type="gemma", hidden_size=512, intermediate_size=2048,
                           num_attention_heads=8, num_key_value_heads=1, head_dim=64,
                           num_hidden_layers=3, vocab_size=32000,
                           max_position_embeddings=4096),
    "phi3-512-v32k": dict(model_type="phi3", hidden_size=512, intermediate_size=1536,
                          num_attention_heads=8, num_key_value_heads=8, num_hidden_layers=3,
                          vocab_size=32064, max_position_embeddings=4096,
                          original_max_position_embeddings=4096, rope_scaling=None,
                          tie_word_embeddings=False),
}


def setting(model, precision, attention, checkpoint, micro_batch, seq_len, dropout=False):
    name = f"{model}/{precision}/{attention}/{'ckpt' if checkpoint else 'nockpt'}" \
           f"/b{micro_batch}s{seq_len}{'/dropout' if dropout else ''}"
    return dict(name=name, model=model, precision=precision, attention=attention,
                checkpoint=checkpoint, micro_batch=micro_batch, seq_len=seq_len,
                dropout=dropout)


# precision: fp32 (an fp32 model), bf16 (a bf16 model), bf16-mixed (fp32 model, bf16 autocast).
SETTINGS = [
    setting("gpt2-256-v50k", "fp32", "eager", False, 8, 512),
    setting("gpt2-256-v50k", "fp32", "sdpa", False, 8, 512),
    setting("gpt2-256-v50k", "fp32", "eager", False, 4, 512, dropout=True),
    setting("gpt2-256-v50k", "bf16", "sdpa", False, 8, 512),
    setting("gpt2-256-v50k", "bf16", "sdpa", True, 8, 1024),
    setting("gpt2-256-v50k", "bf16-mixed", "sdpa", False, 8, 512),
    setting("gpt2-512-v8k", "fp32", "sdpa", False, 4, 1024),
    setting("gpt2-512-v8k", "fp32", "sdpa", True, 4, 1024),
    setting("gpt2-512-v8k", "bf16", "eager", False, 2, 1024),
    setting("gpt2-512-v8k", "bf16", "sdpa", False, 8, 512),
    setting("llama-gqa-512-v32k", "fp32", "sdpa", False, 4, 512),
    setting("llama-gqa-512-v32k", "fp32", "eager", False, 2, 512),
    setting("llama-gqa-512-v32k", "fp32", "sdpa", True, 4, 1024),
    setting("llama-gqa-512-v32k", "bf16", "sdpa", False, 4, 1024),
    setting("llama-gqa-512-v32k", "bf16", "sdpa", True, 8, 1024),
    setting("llama-gqa-512-v32k", "bf16", "eager", False, 2, 1024),
    setting("llama-gqa-512-v32k", "bf16-mixed", "sdpa", False, 4, 512),
    setting("llama-gqa-768-v128k", "bf16", "sdpa", False, 2, 1024),
    setting("llama-gqa-768-v128k", "bf16", "sdpa", True, 4, 512),
    setting("llama-gqa-768-v128k", "fp32", "sdpa", False, 2, 512),
    setting("mistral-512-v32k", "fp32", "sdpa", False, 4, 512),
    setting("mistral-512-v32k", "bf16", "sdpa", False, 4, 1024),
    setting("mistral-512-v32k", "bf16", "sdpa", True, 4, 2048),
    setting("mistral-512-v32k", "bf16", "eager", True, 2, 1024),
    setting("qwen2-512-v152k", "bf16", "sdpa", False, 2, 1024),
    setting("qwen2-512-v152k", "fp32", "sdpa", True, 2, 512),
    setting("qwen2-512-v152k", "bf16", "sdpa", True, 4, 512),
    setting("gemma-512-v32k", "bf16", "sdpa", False, 4, 1024),
    setting("gemma-512-v32k", "fp32", "sdpa", False, 4, 512),
    setting("gemma-512-v32k", "bf16", "sdpa", True, 4, 1024),
    setting("phi3-512-v32k", "bf16", "sdpa", False, 4, 1024),
    setting("phi3-512-v32k", "fp32", "sdpa", True, 4, 512),
    setting("phi3-512-v32k", "fp32", "eager", False, 2, 512),
    setting("phi3-512-v32k", "bf16-mixed", "sdpa", False, 4, 512),
]


def hf_config(model: str, dropout: bool, attention: str):
    from transformers import AutoConfig

    kw = dict(MODELS[model])
    model_type = kw.pop("model_type")
    p = 0.1 if dropout else 0.0
    if model_type == "gpt2":
        kw.update(resid_pdrop=p, embd_pdrop=p, attn_pdrop=p)
    else:
        kw.update(attention_dropout=p)
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = attention
    return cfg


def config_file(model: str, dropout: bool) -> str:
    return f"{model}{'-dropout' if dropout else ''}.json"


def _key(k) -> str:
    """A category's name as MemTracker prints it ("Parameter", "Temp", ..., "Total")."""
    return str(getattr(k, "value", k))


def measure(st: dict) -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM

    class Tracker(MemTracker):
        """MemTracker that also keeps each category's own peak and the phase of the peak."""

        phase = "forward"

        def __init__(self):
            super().__init__()
            self.own_peaks: dict[str, int] = {}
            self.peak_phase = None
            self._best = 0

        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            for snap in self._curr_mem_snap.values():
                for k, v in snap.items():
                    self.own_peaks[_key(k)] = max(self.own_peaks.get(_key(k), 0), v)
                if snap["Total"] > self._best:
                    self._best = snap["Total"]
                    self.peak_phase = self.phase

    cfg = hf_config(st["model"], st["dropout"], st["attention"])
    dtype = torch.bfloat16 if st["precision"] == "bf16" else torch.float32
    b, s = st["micro_batch"], st["seq_len"]
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = AutoModelForCausalLM.from_config(
            cfg, dtype=dtype, attn_implementation=st["attention"])
        model.train()
        if st["checkpoint"]:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        optim = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        # No attention mask: unpadded (packed) batches, for which Hugging Face passes SDPA no
        # mask and `is_causal=True` (under fake tensors an all-ones mask cannot be seen to be
        # all ones, so it would be materialised as a (b, 1, s, s) float mask).
        ids = torch.randint(0, cfg.vocab_size, (b, s))
        mt = Tracker()
        mt.track_external(model, optim)
        with mt:
            for i in range(2):
                mt.phase = "forward"
                if st["precision"] == "bf16-mixed":
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        loss = model(input_ids=ids, labels=ids).loss
                else:
                    loss = model(input_ids=ids, labels=ids).loss
                mt.phase = "backward"
                loss.backward()
                del loss
                mt.phase = "optimizer"
                optim.step()
                optim.zero_grad()
                if i == 0:
                    mt.reset_mod_stats()
        snap = next(iter(mt.get_tracker_snapshot("peak").values()))
        peak = {_key(k): int(v) for k, v in snap.items()}
    return dict(peak_total_bytes=peak.pop("Total"), at_peak=peak,
                own_peaks={k: v for k, v in mt.own_peaks.items() if k != "Total"},
                peak_phase=mt.peak_phase)


def cuda_correction(st: dict, cfg) -> tuple[int, str]:
    """Bytes to add to the CPU tracker's peak for what a CUDA run allocates differently, and why.

    The corrections assume the peak at the loss's backward node, where every activation is
    held (true of every setting here: `peak_phase` is backward).
    - Checkpointed SDPA: under fake tensors transformers cannot skip the causal mask (a fake
      position offset counts as tracing in `masking_utils._ignore_causal_mask_sdpa`), so it
      builds a (b, 1, s, s) bool mask that the checkpointed blocks keep; a real run passes
      `is_causal=True` and no mask.
    - Phi-3 under SDPA: its partial rotary embedding `torch.cat`s the query into a contiguous
      (b, a, s, d) tensor, and the fake (meta) CPU flash kernel allocates its output
      `empty_like(query)` (`torch/_meta_registrations.py`), so `transpose(1, 2).contiguous()`
      copies it; the CPU and CUDA kernels
      allocate the output (b, s, a, d)-major, which the transpose makes contiguous without a
      copy.
    - Dropout: on the CPU `at::dropout` takes `_dropout_impl` (a mask `empty_like(input)` in the
      input's dtype, saved by the product); on CUDA the fused `native_dropout` saves a 1-byte
      bool mask (`is_fused_kernel_acceptable`, aten/src/ATen/native/Dropout.cpp). GPT-2 eager
      drops the attention probabilities (a·s² per sequence and block), both residual branches
      (2·s·h per block) and the embeddings (s·h).
    - Autocast: CUDA autocast runs `pow` in fp32 (its fp32 op list, `AT_FORALL_FP32` in
      aten/src/ATen/autocast_mode.h), so GPT-2's Python gelu_new saves an fp32 copy of its
      input for pow's backward and computes tanh and 1 + tanh in fp32; CPU autocast leaves all
      three bf16: 2 more bytes for each of the three FFN-wide tensors per block. (The tracer's
      CUDA autocast policy, python/headroom/trace/autocast.py, reproduces this op for op.)
    - fp32 SDPA on grouped-query heads without checkpointing: transformers passes
      `enable_gqa=True`; the CPU runs its flash kernel (query, key, value at their widths, the
      output and the log-sum-exp saved), CUDA its math path (flash is 16-bit only, the
      memory-efficient kernel needs equal heads: `select_sdp_backend` in
      aten/src/ATen/native/transformers/cuda/sdp_utils.cpp), whose autograd saves the scaled
      query, the repeated and scaled key and the repeated value (each q-wide) and the fp32
      softmax output, not its own output (o_proj saves the contiguous copy transformers makes,
      where flash's (b, s, a, d)-major output is itself o_proj's input, so the two outputs
      cancel): per block 2·4·b·s·(q − kv) + 4·a·s²·b − 4·a·s·b bytes more. With checkpointing the
      probabilities exist one block at a time, away from the loss's node: no correction.
    """
    b, s = st["micro_batch"], st["seq_len"]
    e = 2 if st["precision"] == "bf16" else 4
    heads = getattr(cfg, "num_attention_heads", 0)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    if (st["precision"] == "fp32" and st["attention"] == "sdpa" and not st["checkpoint"]
            and kv_heads < heads):
        d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        per_block = 2 * 4 * b * s * (heads - kv_heads) * d + 4 * heads * s * s * b - 4 * heads * s * b
        return per_block * cfg.num_hidden_layers, \
            "CUDA runs SDPA's math path on fp32 grouped-query heads, the CPU its flash kernel"
    if st["checkpoint"] and st["attention"] == "sdpa":
        return -b * s * s, "a fake position offset makes transformers build the causal mask"
    if cfg.model_type == "phi3" and st["attention"] == "sdpa":
        q = cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
        out = 4 if st["precision"] == "fp32" else 2  # autocast's SDPA output is bf16
        return -out * b * s * q * cfg.num_hidden_layers, \
            "the CPU flash meta allocates SDPA's output like its query, then copied"
    if cfg.model_type != "gpt2":
        return 0, ""
    n, h, a = cfg.n_layer, cfg.n_embd, cfg.n_head
    f = cfg.n_inner or 4 * h
    if st["dropout"] and st["attention"] == "eager":
        masks = n * (b * a * s * s + 2 * b * s * h) + b * s * h
        return -(e - 1) * masks, "CPU dropout keeps its mask in the input's dtype, CUDA's 1 byte"
    if st["precision"] == "bf16-mixed" and cfg.activation_function == "gelu_new":
        return 3 * 2 * n * b * s * f, "CUDA autocast computes gelu_new's pow input and tanh chain in fp32"
    return 0, ""


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def run_measure(only: str | None) -> None:
    import torch
    import transformers

    DATA.mkdir(parents=True, exist_ok=True)
    results = []
    for st in SETTINGS:
        if only and only not in st["name"]:
            continue
        t0 = time.time()
        r = measure(st)
        cfg = hf_config(st["model"], st["dropout"], st["attention"]).to_dict()
        cfg.pop("_attn_implementation_autoset", None)
        cfg.pop("attn_implementation", None)
        write_atomic(DATA / config_file(st["model"], st["dropout"]),
                     json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\n")
        correction, why = cuda_correction(st, hf_config(st["model"], st["dropout"], st["attention"]))
        row = dict(st, config=config_file(st["model"], st["dropout"]), **r,
                   cuda_correction_bytes=correction, cuda_correction=why)
        results.append(row)
        print(f"{st['name']:58s} {r['peak_total_bytes'] / MIB:9.1f} MiB  "
              f"peak in {r['peak_phase']}  ({time.time() - t0:.1f} s)", flush=True)
    doc = dict(
        source="torch.distributed._tools.mem_tracker.MemTracker under FakeTensorMode on the "
               "CPU; 2 steps (forward with labels, backward, AdamW foreach=True, zero_grad), "
               "the second measured",
        command="benches/pytorch/memtracker_compare.py",
        date=time.strftime("%Y-%m-%d", time.gmtime()),
        torch=torch.__version__, transformers=transformers.__version__,
        settings=results,
    )
    write_atomic(DATA / "settings.json", json.dumps(doc, indent=2) + "\n")


PRECISION_FLAG = {"fp32": "fp32", "bf16": "bf16", "bf16-mixed": "bf16-mixed"}


def plan_args(st: dict) -> list[str]:
    return [
        "--model", str(DATA / st["config"]), "--gpu", "A100-80GB",
        "--precision", PRECISION_FLAG[st["precision"]],
        "--micro-batch", str(st["micro_batch"]), "--seq-len", str(st["seq_len"]),
        "--checkpoint", "all" if st["checkpoint"] else "none",
        "--attention", "naive" if st["attention"] == "eager" else "memory-efficient",
        "--optimizer", "adamw", "--optimizer-impl", "foreach", "--zero", "0",
        "--offload-optimizer", "none", "--offload-params", "none",
        "--offload-activations", "none", "--framework", "fsdp", "--loss", "plain",
        "--loss-impl", "hugging-face", "--optimizer-in-backward", "false",
        "--accumulation", "1", "--json",
    ]


def run_check(binary: Path) -> int:
    doc = json.loads((DATA / "settings.json").read_text())
    errors = []
    print(f"{'setting':58s} {'tracker':>9s} {'planner':>9s} {'error':>7s}  (tracker: CPU peak less"
          " Other, plus the CUDA correction)")
    for st in doc["settings"]:
        out = subprocess.run([str(binary), "plan", *plan_args(st)], capture_output=True,
                             text=True)
        if out.returncode != 0:
            print(f"{st['name']}: headroom plan failed:\n{out.stderr}", file=sys.stderr)
            return 1
        mem = json.loads(out.stdout)["plans"][0]["memory"]
        planned = mem["per_device_peak_bytes"] - mem["by_category"]["other"]
        tracked = (st["peak_total_bytes"] - st["at_peak"].get("Other", 0)
                   + st["cuda_correction_bytes"])
        err = (planned - tracked) / tracked
        errors.append(err)
        print(f"{st['name']:58s} {tracked / MIB:9.1f} {planned / MIB:9.1f} {100 * err:+6.1f}%")
    mean = sum(abs(e) for e in errors) / len(errors)
    worst = max(abs(e) for e in errors)
    signed = sum(errors) / len(errors)
    print(f"\n{len(errors)} settings: mean |error| {100 * mean:.1f} %, worst {100 * worst:.1f} %, "
          f"signed mean {100 * signed:+.1f} %")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="plan every measured setting and print the comparison")
    ap.add_argument("--only", help="measure only settings whose name contains this")
    ap.add_argument("--headroom", type=Path, default=ROOT / "target" / "debug" / "headroom",
                    help="the headroom binary (default: target/debug/headroom)")
    args = ap.parse_args()
    if args.check:
        if not args.headroom.exists():
            print(f"{args.headroom} not found: build it with `cargo build -p headroom`",
                  file=sys.stderr)
            return 1
        return run_check(args.headroom)
    run_measure(args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
