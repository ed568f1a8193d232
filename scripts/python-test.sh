#!/usr/bin/env bash
# Builds the headroom-mem Python package (a debug build: the native module and the `headroom`
# console script), installs it into the repository's Python environment (.venv, created by
# scripts/python-env.sh when missing; HEADROOM_VENV chooses another) as an editable install, and
# runs the Python tests (python/tests). Arguments go to pytest. Exits non-zero on any failure.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$("$root/scripts/python-env.sh")"
cd "$root"
VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" "$venv/bin/maturin" develop --quiet
"$venv/bin/python" -m pytest -q python/tests "$@"
