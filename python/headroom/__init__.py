"""headroom: fit deep-learning training into the memory you have.

- `plan(model, gpu, **levers)`: the fastest combination of memory levers that fits (the JSON of
  `headroom plan --json`, as a dict). Needs no torch.
- `trace(...)`: a PyTorch training step run under fake tensors (no weights, no GPU), every
  tensor allocation and free recorded with its category, phase, module and op. Needs torch
  (imported only when called).
- `tracing(output, steps=None, device="cuda")`: a context manager; the user's own program
  inside it (model, loop, evaluation) runs under fake tensors and every allocation is recorded
  with its Python stack, phase and step, CUDA's kernels emulated as `trace` has them. Needs
  torch.
- `doctor(trace, **options)`: a trace explained (the JSON of `headroom memory doctor --json`, as
  a dict): the peak attributed, leaks with the mistake and its fix, fragmentation by replay.
  Needs no torch.
- `replay(trace, allocator=..., capacity=...)`: a trace through the CUDA caching allocator's
  rules (the JSON of `headroom memory replay --json`, as a dict). Needs no torch.
- `record(path, model=..., optimizer=..., strategy=...)`: a context manager around a real run
  on a CUDA GPU; writes the allocator's snapshot and a record of the run beside it, which
  `replay` and `doctor` read. Needs torch with CUDA.

The `headroom` command line comes with the package.
"""

from headroom._commands import HeadroomError, doctor, plan, replay
from headroom._headroom import __version__
from headroom.record import RecordError, record
from headroom.trace import TraceError, trace, tracing

__all__ = [
    "HeadroomError",
    "RecordError",
    "TraceError",
    "doctor",
    "plan",
    "record",
    "replay",
    "trace",
    "tracing",
    "__version__",
]
