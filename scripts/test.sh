#!/usr/bin/env bash
# Every test: the Rust workspace's, then the Python package's (scripts/python-test.sh builds the
# package into the repository's own environment, .venv, creating it with a CPU-runnable torch
# when missing). Arguments go to `cargo test`. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
bash scripts/python-test.sh
