"""Shared fixtures: tiny Hugging Face configs (2 layers, width 64, vocabulary 1000) written to
files, the `headroom` console script of the environment under test, and the scripts of
`benches/pytorch/` loaded as modules."""

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

GPT2 = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 4,
    "n_positions": 128,
    "vocab_size": 1000,
    "bos_token_id": 0,
    "eos_token_id": 0,
}

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


BENCHES = Path(__file__).resolve().parents[2] / "benches" / "pytorch"


def bench_script(name: str):
    """`benches/pytorch/{name}.py` loaded as the module `name` (once per session)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def write_config(directory: Path, name: str, config: dict) -> Path:
    path = directory / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
def gpt2_config(tmp_path):
    return write_config(tmp_path, "gpt2", GPT2)


@pytest.fixture
def llama_config(tmp_path):
    return write_config(tmp_path, "llama", LLAMA)


@pytest.fixture(scope="session")
def headroom_cli():
    """The console script installed next to this interpreter (HEADROOM_CLI, when set, names
    another build of the command line: a cargo build's binary)."""
    if os.environ.get("HEADROOM_CLI"):
        return os.environ["HEADROOM_CLI"]
    path = Path(sys.executable).parent / "headroom"
    if not path.exists():
        found = shutil.which("headroom")
        assert found, "the headroom console script is not installed (run scripts/python-test.sh)"
        path = Path(found)
    return str(path)


@pytest.fixture
def cli_env():
    """The environment for `headroom trace`: this interpreter as the tracer's Python."""
    env = dict(os.environ)
    env["HEADROOM_PYTHON"] = sys.executable
    return env
