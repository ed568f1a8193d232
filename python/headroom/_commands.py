"""`plan`, `replay` and `doctor`: headroom's commands called in process, their `--json` reports
returned as dicts (the same JSON as `headroom plan --json`, `headroom memory replay --json` and
`headroom memory doctor --json`).

Keyword arguments become the command's flags: `micro_batch=4` is `--micro-batch 4`, `True` is a
bare flag, `False` and `None` are left out, a list repeats the flag. Not for: tracing (that is
`headroom.trace`, which needs torch).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Iterable, Optional, Union

from headroom import _headroom


class HeadroomError(RuntimeError):
    """A headroom command failed; the message is the command's own error."""


def _flags(options: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


def _run_json(argv: list[str], *, report_on_error: bool = False) -> dict:
    report, error = _headroom.run_json(["headroom", *argv, "--json"])
    if error is not None and not (report_on_error and report is not None):
        raise HeadroomError(error)
    if report is None:
        raise HeadroomError(f"headroom {argv[0]} wrote no report")
    return json.loads(report)


def plan(model: str, gpu: Optional[str] = None, **levers: Any) -> dict:
    """The plan `headroom plan --json` prints, as a dict.

    `model` is a built-in name, a Hugging Face config.json or a Hub id; `gpu` a GPU name
    (`h100-80gb`, …); `levers` any other `headroom plan` flag (`seq_len=4096`,
    `micro_batch=4`, `accumulation=8`, `checkpoint="all"`, …). When no plan fits, the dict is
    still returned: its `shortfall` says what would fit.
    """
    argv = ["plan", "--model", str(model)]
    if gpu is not None:
        argv += ["--gpu", str(gpu)]
    if "emit" in levers:
        raise HeadroomError("plan(emit=...) is not supported here; run `headroom plan --emit` instead")
    return _run_json(argv + _flags(levers), report_on_error=True)


TraceInput = Union[str, os.PathLike, Iterable[dict]]


def _on_trace(trace: TraceInput, argv: list[str]) -> dict:
    """Runs `headroom <argv[0..]> TRACE <argv[..]>` on a trace file or on events in memory
    (written to a temporary file first)."""
    command, flags = argv[:2], argv[2:]
    if isinstance(trace, (str, os.PathLike)):
        return _run_json([*command, os.fspath(trace), *flags])
    with tempfile.TemporaryDirectory(prefix="headroom-") as tmp:
        path = os.path.join(tmp, "trace.json")
        with open(path, "w") as f:
            json.dump(list(trace), f)
        return _run_json([*command, path, *flags])


def replay(trace: TraceInput, allocator: str = "caching", capacity: Optional[str] = None, **options: Any) -> dict:
    """The report of `headroom memory replay --json`, as a dict.

    `trace` is a trace file (headroom JSON or a PyTorch snapshot pickle) or the events
    themselves (what `headroom.trace` returns); `allocator` is `caching`, `expandable` or
    `planned`; `capacity` a size such as "16GiB"; `options` other replay flags
    (`alloc_conf="max_split_size_mb:128"`, `snapshot="out.pickle"`, `timeline="t.svg"`).
    """
    flags = _flags({"allocator": allocator, "capacity": capacity, **options})
    return _on_trace(trace, ["memory", "replay", *flags])


def doctor(trace: TraceInput, capacity: Optional[str] = None, **options: Any) -> dict:
    """The diagnosis `headroom memory doctor --json` prints, as a dict: the peak attributed
    (`peak`), what is kept across steps with the mistake it looks like and its fix (`leaks`),
    fragmentation by replay (`fragmentation`), and what could not be attributed (`limits`).

    `trace` is a trace file (a PyTorch snapshot pickle or headroom JSON, such as
    `headroom.tracing` writes) or the events themselves; `capacity` a device size such as
    "24GiB" for the out-of-memory replays; `options` other doctor flags
    (`alloc_conf="max_split_size_mb:128"`, `sites=8`, `source_root="src/"`).
    """
    flags = _flags({"capacity": capacity, **options})
    return _on_trace(trace, ["memory", "doctor", *flags])
