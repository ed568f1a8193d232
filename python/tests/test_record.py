"""`headroom.record` on a machine without a GPU: PyTorch's CUDA recording functions are replaced
by a stand-in that keeps the calls and builds the snapshot a CUDA run would (each allocation
tagged with the calling thread's metadata), so what `record` asks of PyTorch, the files it
writes and how `replay` and `doctor` read them are checked. A real GPU run replaces the
stand-in with the device (docs/python.md, "Recording a real run")."""

import json
import os
import pickle

import pytest

torch = pytest.importorskip("torch")

import headroom  # noqa: E402

MIB = 1 << 20


class FakeCudaMemory:
    """Stands in for `torch.cuda.memory` with what `record` calls."""

    def __init__(self):
        self.history = []
        self.metadata = ""
        self.entries = []

    def _get_memory_metadata(self):
        return self.metadata

    def _set_memory_metadata(self, metadata):
        self.metadata = metadata if isinstance(metadata, str) else json.dumps(metadata)

    def _record_memory_history(self, enabled="all", **options):
        self.history.append((enabled, options))

    def _dump_snapshot(self, filename):
        with open(filename, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [list(self.entries)]}, f)

    # The run: allocations by the recording thread carry its metadata, autograd's do not.
    def alloc(self, addr, size, on_autograd_thread=False):
        entry = {"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": []}
        if self.metadata and not on_autograd_thread:
            entry["user_metadata"] = self.metadata
        self.entries.append(entry)

    def free(self, addr, size):
        for action in ("free_requested", "free_completed"):
            self.entries.append({"action": action, "addr": addr, "size": size, "stream": 0, "frames": []})


class Props:
    name = "NVIDIA Test GPU"
    total_memory = 24 * 1024 * MIB


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCudaMemory()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory", fake)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    return fake


def one_step(rec, cuda, step):
    # Forward 1 MiB; backward 4 MiB on autograd's thread; the optimizer 8 MiB, the peak.
    with rec.phase("forward", step):
        cuda.alloc(1, 1 * MIB)
    cuda.alloc(2, 4 * MIB, on_autograd_thread=True)
    with rec.phase("optimizer", step):
        cuda.alloc(3, 8 * MIB)
    for addr, size in ((1, MIB), (2, 4 * MIB), (3, 8 * MIB)):
        cuda.free(addr, size)


def test_a_recorded_run_is_replayed_with_its_phases_and_its_record(tmp_path, cuda):
    model = torch.nn.Linear(64, 64)
    model.bias.requires_grad_(False)
    opt = torch.optim.AdamW([model.weight], lr=1e-3, weight_decay=0.1)
    path = tmp_path / "run.pickle"
    with headroom.record(str(path), model=model, optimizer=opt, strategy={"precision": "bf16-mixed"}) as rec:
        one_step(rec, cuda, 0)
    # History on with the entry limit, then off; the thread's metadata back as it was.
    assert cuda.history[0] == ("all", {"max_entries": 1_000_000})
    assert cuda.history[-1] == (None, {})
    assert cuda.metadata == ""
    facts = json.loads((tmp_path / "run.pickle.json").read_text())
    assert facts["format"] == "headroom-record" and facts["snapshot"] == "run.pickle"
    # 64·64 + 64 parameters in float32, the bias frozen.
    assert facts["model"] == {
        "class": "Linear",
        "parameters": 4160,
        "trainable_parameters": 4096,
        "parameters_by_dtype": {"float32": 4160},
    }
    assert facts["optimizer"]["class"] == "AdamW"
    assert facts["optimizer"]["settings"]["lr"] == 1e-3
    assert facts["optimizer"]["settings"]["weight_decay"] == 0.1
    assert facts["phases"] == ["forward", "optimizer"]
    assert facts["device"] == {"name": "NVIDIA Test GPU", "total_memory_bytes": 24 * 1024 * MIB}
    assert facts["side"] is None  # no sequence length or batch given
    assert "ended_by" not in facts

    report = headroom.replay(str(path))
    assert report["at_peak"]["size"] == 8 * MIB
    assert report["at_peak"]["phase"] == "optimizer" and report["at_peak"]["step"] == 0
    assert report["recorded"]["model"]["class"] == "Linear"
    assert [f for f in os.listdir(tmp_path) if f.startswith(".headroom-record-")] == []


def test_an_out_of_memory_error_still_leaves_the_record(tmp_path, cuda):
    path = tmp_path / "oom.pickle"
    with pytest.raises(torch.cuda.OutOfMemoryError):
        with headroom.record(str(path)) as rec:
            one_step(rec, cuda, 0)
            with rec.phase("forward", 1):
                cuda.alloc(4, 2 * MIB)
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    facts = json.loads((tmp_path / "oom.pickle.json").read_text())
    assert facts["ended_by"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"
    assert cuda.history[-1] == (None, {}) and cuda.metadata == ""
    report = headroom.replay(str(path))
    assert report["outcome"]["allocs"] == 4


def test_a_record_with_the_runs_split_gives_the_doctor_its_side(tmp_path, cuda):
    path = tmp_path / "run.pickle"
    strategy = {"model": "gpt2", "seq_len": 128, "micro_batch": 2, "precision": "fp32", "note": "mine"}
    with headroom.record(str(path), strategy=strategy) as rec:
        one_step(rec, cuda, 0)
        one_step(rec, cuda, 1)
    facts = json.loads((tmp_path / "run.pickle.json").read_text())
    # The doctor's keys, the device's capacity; the user's own note stays in the strategy only.
    assert facts["side"] == {
        "model": "gpt2",
        "seq_len": 128,
        "micro_batch": 2,
        "precision": "fp32",
        "capacity": 24 * 1024 * MIB,
    }
    assert facts["strategy"]["note"] == "mine"
    report = headroom.doctor(str(path))
    assert report["run"] is not None, report
    assert report["recorded"]["side"]["model"] == "gpt2"


def test_record_refuses_what_it_cannot_record(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(headroom.RecordError, match="no CUDA device"):
        with headroom.record(str(tmp_path / "x.pickle")):
            pass
    with pytest.raises(headroom.RecordError, match="positive number"):
        headroom.record(str(tmp_path / "x.pickle"), max_entries=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(headroom.RecordError, match="does not exist"):
        with headroom.record(str(tmp_path / "missing" / "x.pickle")):
            pass
