"""Recording a real GPU run's memory: `headroom.record(path, ...)`.

A context manager around the user's own training loop on a CUDA device. Inside it PyTorch's
allocator history is on (`torch.cuda.memory._record_memory_history`, every allocation and free
with its Python stack); `phase(name, step)` tags what the calling thread allocates
(`torch.cuda.memory._set_memory_metadata`, which PyTorch writes as each trace entry's
`user_metadata`). On leaving — normally or by an exception such as an out-of-memory error,
when the record matters most — it writes:

- `path`: the PyTorch snapshot pickle (`torch.cuda.memory._dump_snapshot`), which
  pytorch.org/memory_viz opens and `headroom memory replay` / `headroom memory doctor` read;
- `path + ".json"`: what the snapshot cannot say — the model (class, parameters by dtype),
  the optimizer (class and its scalar settings), the strategy the user states, the device and
  its capacity, torch's version, the phases tagged and how the run ended — which `headroom
  memory replay` and `headroom memory doctor` print beside their report; when the strategy
  gives `seq_len` and `micro_batch` (and the model is a Hugging Face one, whose config is
  written to `path + ".config.json"`, or `strategy["model"]` names it), also the doctor's side
  JSON, so `headroom memory doctor path` ranks the levers for this run.

Both files are written atomically (a temporary file beside the target, then renamed). Backward
runs on autograd's device threads, whose allocations carry no metadata: the doctor reads those
from their stacks as it reads any snapshot.

torch is imported when a recording starts, never at `import headroom`.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Dict, Iterator, List, Optional

SIDE_FORMAT = "headroom-record"
SIDE_VERSION = 1

# The doctor's side JSON keys (`headroom memory doctor --side`, docs/doctor.md): the strategy's
# entries under these names are copied into the record's "side".
DOCTOR_SIDE_KEYS = (
    "model", "gpu", "capacity", "gpus_per_node", "nodes", "seq_len", "micro_batch",
    "accumulation", "precision", "optimizer", "zero", "offload_optimizer", "offload_params",
    "checkpoint", "attention", "loss", "framework",
)


class RecordError(RuntimeError):
    """A recording that cannot start or be written, with the reason and the fix."""


def _write_atomically(path: str, write) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".headroom-record-", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _model_facts(model: Any) -> Dict[str, Any]:
    by_dtype: Dict[str, int] = {}
    trainable = 0
    for p in model.parameters():
        dtype = str(p.dtype).replace("torch.", "")
        by_dtype[dtype] = by_dtype.get(dtype, 0) + p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return {
        "class": type(model).__name__,
        "parameters": sum(by_dtype.values()),
        "trainable_parameters": trainable,
        "parameters_by_dtype": by_dtype,
    }


def _optimizer_facts(optimizer: Any) -> Dict[str, Any]:
    settings = {
        k: v
        for k, v in getattr(optimizer, "defaults", {}).items()
        if isinstance(v, (bool, int, float, str)) or v is None
    }
    return {"class": type(optimizer).__name__, "settings": settings}


class Recorder:
    """The recording `headroom.record` returns; see the module's documentation."""

    def __init__(
        self,
        path: str,
        *,
        model: Any = None,
        optimizer: Any = None,
        strategy: Optional[Dict[str, Any]] = None,
        max_entries: int = 1_000_000,
        device: Any = None,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise RecordError("record(path, ...): path must be a file name for the snapshot pickle")
        if max_entries < 1:
            raise RecordError(f"max_entries is {max_entries}; accepted: a positive number of trace entries")
        if strategy is not None and not isinstance(strategy, dict):
            raise RecordError("strategy must be a dict of the run's settings, e.g. {'precision': 'bf16-mixed'}")
        self.path = os.fspath(path)
        self.side_path = self.path + ".json"
        self.model = model
        self.optimizer = optimizer
        self.strategy = dict(strategy or {})
        self.max_entries = max_entries
        self.device = device
        self.phases: List[Dict[str, Any]] = []
        self._torch: Any = None
        self._saved_metadata = ""

    def __enter__(self) -> "Recorder":
        try:
            import torch
        except ImportError as e:
            raise RecordError("record() needs torch: pip install torch") from e
        if not torch.cuda.is_available():
            raise RecordError(
                "record() records a CUDA device's allocator and torch sees no CUDA device here; "
                "to plan without a GPU, trace the program instead (headroom.tracing)"
            )
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise RecordError(f"the snapshot's folder {directory} does not exist; create it or choose another path")
        self._torch = torch
        self._saved_metadata = torch.cuda.memory._get_memory_metadata()
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        return self

    @contextlib.contextmanager
    def phase(self, name: str, step: Optional[int] = None) -> Iterator[None]:
        """Tags what this thread allocates inside with `name` (forward, backward, optimizer,
        zero_grad, evaluation or a name of the user's) and the step."""
        if self._torch is None:
            raise RecordError("phase() is used inside `with headroom.record(...) as rec:`")
        if not isinstance(name, str) or not name:
            raise RecordError("a phase needs a name, e.g. rec.phase('forward', step)")
        memory = self._torch.cuda.memory
        previous = memory._get_memory_metadata()
        tag: Dict[str, Any] = {"phase": name}
        if step is not None:
            tag["step"] = int(step)
        if not any(p["phase"] == name for p in self.phases):
            self.phases.append({"phase": name})
        memory._set_memory_metadata(json.dumps(tag))
        try:
            yield
        finally:
            memory._set_memory_metadata(previous)

    def _side(self, failure: Optional[BaseException]) -> Dict[str, Any]:
        torch = self._torch
        device = self.device if self.device is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(device)
        side: Dict[str, Any] = {
            "format": SIDE_FORMAT,
            "version": SIDE_VERSION,
            "snapshot": os.path.basename(self.path),
            "torch": torch.__version__,
            "device": {"name": props.name, "total_memory_bytes": int(props.total_memory)},
            "strategy": self.strategy,
            "phases": [p["phase"] for p in self.phases],
        }
        if self.model is not None:
            side["model"] = _model_facts(self.model)
        if self.optimizer is not None:
            side["optimizer"] = _optimizer_facts(self.optimizer)
        if failure is not None:
            first = str(failure).splitlines()[0] if str(failure) else ""
            side["ended_by"] = f"{type(failure).__name__}: {first}".rstrip(": ")
        side["side"] = self._doctor_side(int(props.total_memory))
        return side

    def _doctor_side(self, capacity: int) -> Optional[Dict[str, Any]]:
        """The doctor's side JSON for this run, when the strategy gives its sequence length and
        micro-batch and the model is known (a name in `strategy["model"]`, or a Hugging Face
        model's config, written beside the snapshot)."""
        side = {k: self.strategy[k] for k in DOCTOR_SIDE_KEYS if k in self.strategy}
        if "model" not in side:
            config = getattr(self.model, "config", None)
            if config is None or not hasattr(config, "to_json_file"):
                return None
            config_path = self.path + ".config.json"
            _write_atomically(config_path, lambda tmp: config.to_json_file(tmp))
            side["model"] = os.path.basename(config_path)
        if "seq_len" not in side or "micro_batch" not in side:
            return None
        if "gpu" not in side and "capacity" not in side:
            side["capacity"] = capacity
        return side

    def __exit__(self, kind, value, traceback) -> bool:
        torch = self._torch
        memory = torch.cuda.memory
        try:
            _write_atomically(self.path, lambda tmp: memory._dump_snapshot(tmp))
            side = self._side(value)

            def write_side(tmp: str) -> None:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(json.dumps(side, indent=1) + "\n")

            _write_atomically(self.side_path, write_side)
        finally:
            memory._record_memory_history(enabled=None)
            memory._set_memory_metadata(self._saved_metadata)
        return False


def record(path: str, **options: Any) -> Recorder:
    """`with headroom.record("run.pickle", model=model, optimizer=opt, strategy={...}) as rec:`
    records the run's allocator history; `rec.phase("forward", step)` tags a phase. See the
    module's documentation for what is written."""
    return Recorder(path, **options)
