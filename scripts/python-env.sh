#!/usr/bin/env bash
# Creates (once) and prints the path of the repository's Python environment, `.venv` at the
# repository root: torch (the package index's wheel; it runs on the CPU), transformers, peft,
# maturin and pytest. A rerun reuses what is there; delete `.venv` to start over.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${HEADROOM_VENV:-$root/.venv}"
stamp="$venv/.headroom-ready"
if [ ! -f "$stamp" ]; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade pip >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "torch>=2.5" numpy "transformers>=4.45" "peft>=0.13" "maturin>=1.7,<2" pytest >&2
  touch "$stamp"
fi
echo "$venv"
