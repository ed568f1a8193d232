"""`python -m headroom.trace MODEL --seq-len N ... --output trace.json`: the tracer's command
line, which `headroom trace` runs. Progress and errors go to stderr; a bad input is one line
naming the problem and exit status 2 (torch missing: 3)."""

from __future__ import annotations

import argparse
import sys
import time

from headroom.trace import TraceError, trace
from headroom.trace.targets import CUDA_ARCHS, DEVICES


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _loss(spec: str):
    import importlib

    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise TraceError(f"--loss {spec}: cannot load package.module:function ({e})") from None
    return fn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m headroom.trace", description=__doc__)
    parser.add_argument("model", help="a Hugging Face config.json (or its directory), or package.module:function")
    parser.add_argument("--micro-batch", type=_positive, default=1)
    parser.add_argument("--seq-len", type=_positive, required=True)
    parser.add_argument("--steps", type=_positive, default=2)
    parser.add_argument("--dtype", choices=["fp32", "bf16", "bf16-autocast", "fp16-autocast"], default="fp32")
    parser.add_argument("--optimizer-impl", choices=["foreach", "fused", "for-loop"], default="foreach")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--loss", help="package.module:function called as f(model, input_ids)")
    parser.add_argument("--vocab-size", type=_positive)
    parser.add_argument(
        "--device", choices=list(DEVICES), default="cuda",
        help="cuda: the CUDA kernels' allocations where they differ from the CPU's (default); "
        "cpu: the CPU kernels' trace as it ran",
    )
    parser.add_argument(
        "--cuda-arch", choices=list(CUDA_ARCHS), default="sm90",
        help="the GPU generation the cuBLAS workspace is sized for: sm90 (Hopper, 32 MiB) or "
        "sm80 (any other, 8 MiB + 128 KiB)",
    )
    parser.add_argument(
        "--fsdp", type=_positive, metavar="RANKS",
        help="trace rank 0 of an FSDP2 run of this many ranks (fully_shard on each block and the "
        "root, under PyTorch's fake process group)",
    )
    parser.add_argument(
        "--no-reshard-after-forward", action="store_true",
        help="with --fsdp: keep each unit gathered from its forward to its backward "
        "(fully_shard's reshard_after_forward=False)",
    )
    parser.add_argument(
        "--ddp", action="store_true",
        help="trace one rank of a DDP run: its gradient buckets beside the gradients",
    )
    parser.add_argument("--output", "-o", required=True, help="where to write the trace JSON")
    args = parser.parse_args(argv)
    if args.no_reshard_after_forward and args.fsdp is None:
        parser.error("--no-reshard-after-forward applies to an FSDP2 trace; give --fsdp RANKS")
    started = time.perf_counter()
    try:
        events = trace(
            args.model,
            micro_batch=args.micro_batch,
            seq_len=args.seq_len,
            steps=args.steps,
            dtype=args.dtype,
            optimizer_impl=args.optimizer_impl,
            gradient_checkpointing=args.gradient_checkpointing,
            loss=_loss(args.loss) if args.loss else None,
            vocab_size=args.vocab_size,
            device=args.device,
            cuda_arch=args.cuda_arch,
            fsdp=args.fsdp,
            reshard_after_forward=not args.no_reshard_after_forward,
            ddp=args.ddp,
            output=args.output,
        )
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3 if "needs PyTorch" in str(e) else 2
    allocs = sum(1 for e in events if e["action"] == "alloc")
    print(
        f"traced {args.steps} step(s) of {args.model}: {allocs} allocations, "
        f"{len(events) - allocs} frees in {time.perf_counter() - started:.1f} s; wrote {args.output}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
