#!/usr/bin/env bash
# Creates (once) and prints the path of the repository's Python environment, `.venv` at the
# repository root: torch (the package index's wheel; it runs on the CPU), transformers, peft,
# maturin and pytest. A rerun reuses what is there; delete `.venv` to start over.
#
# Disk: the package index's Linux torch links the CUDA libraries (about 3 GB of nvidia-* wheels)
# even when it runs on the CPU. One `pip install` of everything downloads every wheel before it
# unpacks any, so its peak is the wheels plus the installed tree (about 9 GB). Here pip resolves
# once (`--dry-run --report`), then installs the resolved versions a few at a time, so the peak is
# the installed tree plus one wheel. triton, torch's GPU kernel compiler, is left out (1 GB): the
# tests trace under FakeTensorMode and compile nothing, and torch imports it only when asked to.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${HEADROOM_VENV:-$root/.venv}"
stamp="$venv/.headroom-ready"
requirements=("torch>=2.5" numpy "transformers>=4.45" "peft>=0.13" "maturin>=1.7,<2" pytest)
if [ ! -f "$stamp" ]; then
  python3 -m venv "$venv" >&2
  pip=("$venv/bin/pip" --disable-pip-version-check --quiet)
  "${pip[@]}" install --upgrade pip >&2
  report="$venv/headroom-resolved.json"
  "${pip[@]}" install --dry-run --report "$report" "${requirements[@]}" >&2
  # name==version per line, the large wheels (torch, nvidia-*, cuda-*) each on a line of their
  # own, the small ones together on the last line.
  mapfile -t batches < <("$venv/bin/python" - "$report" <<'EOF'
import json, sys
resolved = json.load(open(sys.argv[1]))["install"]
pins = [f"{r['metadata']['name']}=={r['metadata']['version']}" for r in resolved
        if r["metadata"]["name"].lower() != "triton"]
large = [p for p in pins if p.lower().startswith(("torch==", "nvidia-", "cuda-"))]
for pin in large:
    print(pin)
print(" ".join(p for p in pins if p not in large))
EOF
  )
  for batch in "${batches[@]}"; do
    [ -n "$batch" ] || continue
    # shellcheck disable=SC2086 # a batch is several name==version words
    "${pip[@]}" install --no-deps $batch >&2
  done
  rm -f "$report"
  touch "$stamp"
fi
echo "$venv"
