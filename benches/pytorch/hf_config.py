"""What the scripts of this folder share on their command line: another transformers
install put first on the path (`--transformers DIR`), and a Hugging Face config.json read with
a clear error for a missing, malformed or foreign file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def use_transformers(folder: str | None) -> None:
    """Puts `folder` (a separate transformers install) before the environment's own."""
    if folder:
        sys.path.insert(0, str(Path(folder).resolve()))


def read_config(parser: argparse.ArgumentParser, path: str) -> dict:
    """The fields of the config.json at `path`; exits through `parser` naming the problem."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        parser.error(f"--config {path}: {e}; give a Hugging Face config.json")
    if not isinstance(config, dict) or "model_type" not in config:
        parser.error(f"--config {path}: no model_type; give a Hugging Face config.json")
    return config


def require_positive(parser: argparse.ArgumentParser, **values: float) -> None:
    """Exits through `parser` when a size flag is zero or negative, naming it."""
    for name, value in values.items():
        if value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
