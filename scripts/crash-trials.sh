#!/usr/bin/env bash
# Crash trials: kill `headroom train` with SIGKILL at random moments, and abort it just before
# each file operation of a save, then resume until the run completes, and compare the final
# saved weights and optimizer state, and the losses, with an uninterrupted run — by hash.
#
# Usage: scripts/crash-trials.sh [TRIALS] [HEADROOM_BINARY]
#   TRIALS (default 20) random kills, plus one abort before each save operation.
#   HEADROOM_BINARY defaults to target/release/headroom (built if missing).
set -euo pipefail
trials=${1:-20}
bin=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "$bin" ]; then
  bin="$root/target/release/headroom"
  [ -x "$bin" ] || (cd "$root" && cargo build --release -p headroom >/dev/null)
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

steps=12
run=(train --model gpt-tiny --no-auto --micro-batch 2 --steps "$steps" --eval-every 4
     --eval-batches 1 --no-timeline --save-every 1)

# The final state of a run, as hashes: every tensor file of the last save, and the losses.
fingerprint() {
  local dir=$1/step-$(printf %06d "$steps")
  (cd "$dir" && sha256sum ./*.safetensors)
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["losses"])' "$dir/manifest.json"
}

# Resumes (or starts, when no save completed) until the run reaches its last step.
finish() {
  local dir=$1
  for _ in 1 2 3; do
    if [ -f "$dir/step-$(printf %06d "$steps")/manifest.json" ]; then return 0; fi
    if "$bin" train --resume "$dir" --no-timeline >/dev/null 2>resume.err; then continue; fi
    if grep -q "no saved run" resume.err; then
      "$bin" "${run[@]}" --save-dir "$dir" >/dev/null 2>&1 || true
    else
      cat resume.err >&2; return 1
    fi
  done
  [ -f "$dir/step-$(printf %06d "$steps")/manifest.json" ]
}

"$bin" "${run[@]}" --save-dir straight >/dev/null 2>&1
expected=$(fingerprint straight)
# How long the uninterrupted run takes, to spread the kills over it.
start=$(date +%s%N); "$bin" "${run[@]}" --save-dir timing >/dev/null 2>&1; end=$(date +%s%N)
span_ms=$(( (end - start) / 1000000 ))

passed=0; failed=0
check() {
  if [ "$(fingerprint "$1")" = "$expected" ]; then passed=$((passed + 1));
  else failed=$((failed + 1)); echo "trial $1: final state differs" >&2; fi
}
for i in $(seq 1 "$trials"); do
  dir=kill-$i
  "$bin" "${run[@]}" --save-dir "$dir" >/dev/null 2>&1 &
  pid=$!
  sleep "$(awk -v s="$span_ms" -v r="$RANDOM" 'BEGIN { printf "%.3f", (r % 1000) / 1000 * s / 1000 }')"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  finish "$dir" && check "$dir" || { failed=$((failed + 1)); echo "trial $dir did not finish" >&2; }
done
for op in create model.safetensors optimizer.safetensors manifest.json manifest.crc32 rename latest; do
  dir=abort-$op
  HEADROOM_CRASH_BEFORE=$op "$bin" "${run[@]}" --save-dir "$dir" >/dev/null 2>&1 &
  wait $! 2>/dev/null || true
  finish "$dir" && check "$dir" || { failed=$((failed + 1)); echo "trial $dir did not finish" >&2; }
done
echo "crash-trials: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
