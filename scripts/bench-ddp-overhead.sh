#!/usr/bin/env bash
# Data parallelism on threads against one process accumulating the same micro-batches: gpt-small
# in fp32, micro-batch 4, global batch 8 per step, 20 steps; one process with --accumulation 2
# beside --data-parallel 2 (DDP) and --data-parallel 2 --zero 3, interleaved in ROUNDS rounds
# (default 3), each the median of steps 4-20, with the load average before and after each round.
# Usage: scripts/bench-ddp-overhead.sh HEADROOM_BINARY [ROUNDS]   (cargo build --release -p headroom)
set -euo pipefail
bin_arg=${1:?usage: scripts/bench-ddp-overhead.sh HEADROOM_BINARY [ROUNDS]}
bin=$(cd "$(dirname "$bin_arg")" && pwd)/$(basename "$bin_arg")
rounds=${2:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
base=(train --model gpt-small --no-auto --precision fp32 --micro-batch 4 --steps 20
      --eval-every 0 --eval-batches 1 --no-timeline)
med() {
  python3 -c "import json,statistics,sys; print(statistics.median(json.load(open(sys.argv[1]))['step_times_s'][3:]))" "$1"
}
for round in $(seq "$rounds"); do
  before=$(cut -d' ' -f1 /proc/loadavg)
  "$bin" "${base[@]}" --accumulation 2 --json-report acc.json >/dev/null 2>&1
  "$bin" "${base[@]}" --data-parallel 2 --json-report ddp.json >/dev/null 2>&1
  "$bin" "${base[@]}" --data-parallel 2 --zero 3 --json-report z3.json >/dev/null 2>&1
  after=$(cut -d' ' -f1 /proc/loadavg)
  python3 - "$round" "$before" "$after" "$(med acc.json)" "$(med ddp.json)" "$(med z3.json)" <<'PY'
import sys
r, l0, l1 = sys.argv[1:4]
a, d, z = map(float, sys.argv[4:7])
print(f"round {r} (load {l0} -> {l1}): accumulate 2 {a:.4f} s, DDP 2 {d:.4f} s ({100 * (d / a - 1):+.1f} %), "
      f"ZeRO-3 2 {z:.4f} s ({100 * (z / a - 1):+.1f} %)")
PY
done
