"""`headroom.trace.sweep`: one training program traced under several settings of its memory
levers (precision, activation checkpointing, micro-batch, the optimizer's implementation, the
attention implementation, LoRA),
one `headroom.trace` per setting, all in this one process (PyTorch and transformers are
imported once, which is most of a small trace's time).

`python -m headroom.trace.sweep SPEC.json` is what `headroom plan --trace` runs: the spec names
the model, the sequence length, the steps and the variants, and the directory the traces go
to; the result (each variant with its trace file, or the error that stopped it) is one JSON
object on stdout. Progress goes to stderr.

Not for: choosing among the variants (the `headroom plan --trace` command replays each trace
through the caching allocator and ranks them with the planner's speed model).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

from headroom.trace import TraceError, trace

# The settings a variant may give, as `headroom.trace` names its keyword arguments.
VARIANT_KEYS = (
    "seq_len",
    "dtype",
    "micro_batch",
    "optimizer_impl",
    "gradient_checkpointing",
    "attention",
    "lora_rank",
    "lora_alpha",
    "lora_targets",
    "fsdp",
    "reshard_after_forward",
    "ddp",
)


def sweep(
    model: Union[str, os.PathLike, Callable[[], Any]],
    variants: list[dict],
    *,
    seq_len: int,
    output_dir: Union[str, os.PathLike],
    steps: int = 2,
    vocab_size: Optional[int] = None,
    loss: Optional[Callable[[Any, Any], Any]] = None,
    device: str = "cuda",
    cuda_arch: str = "sm90",
    progress: Optional[Callable[[str], None]] = None,
) -> list[dict]:
    """Traces `model` once per variant and writes each trace to `output_dir/variant-I.json`.

    variants: dicts of `headroom.trace` settings (`VARIANT_KEYS`); unset keys take trace's
        defaults, and `seq_len` the sweep's. Returns, per variant in order, its settings with `trace` (the file written),
        `allocs` (allocations recorded) and `seconds`, or with `error` (the TraceError's
        message) when that setting cannot be traced; the other variants still run.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for i, variant in enumerate(variants):
        unknown = set(variant) - set(VARIANT_KEYS)
        if unknown:
            raise TraceError(
                f"variant {i} has unknown settings {sorted(unknown)}; accepted: {', '.join(VARIANT_KEYS)}"
            )
        path = out / f"variant-{i}.json"
        started = time.perf_counter()
        try:
            events = trace(
                model,
                **{"seq_len": seq_len, **variant},
                steps=steps,
                vocab_size=vocab_size,
                loss=loss,
                device=device,
                cuda_arch=cuda_arch,
                output=path,
            )
        except TraceError as e:
            results.append({**variant, "error": str(e)})
            if progress:
                progress(f"variant {i + 1}/{len(variants)} {variant}: {e}")
            continue
        seconds = time.perf_counter() - started
        allocs = sum(1 for e in events if e["action"] == "alloc")
        results.append({**variant, "trace": str(path), "allocs": allocs, "seconds": round(seconds, 3)})
        if progress:
            progress(f"variant {i + 1}/{len(variants)} {variant}: {allocs} allocations in {seconds:.1f} s")
    return results


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m headroom.trace.sweep SPEC.json", file=sys.stderr)
        return 2
    try:
        spec = json.loads(Path(args[0]).read_text())
        loss = spec.get("loss")
        if loss:
            from headroom.trace.__main__ import _loss

            loss = _loss(loss)
        results = sweep(
            spec["model"],
            spec["variants"],
            seq_len=spec["seq_len"],
            output_dir=spec["output_dir"],
            steps=spec.get("steps", 2),
            vocab_size=spec.get("vocab_size"),
            loss=loss or None,
            device=spec.get("device", "cuda"),
            cuda_arch=spec.get("cuda_arch", "sm90"),
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {args[0]} is not a sweep spec ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3 if "needs PyTorch" in str(e) else 2
    json.dump({"variants": results}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
