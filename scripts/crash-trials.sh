#!/usr/bin/env bash
# Crash trials: kill `headroom train` with SIGKILL at random moments, and abort it just before
# each file operation of a save, then resume until the run completes, and compare the final
# saved weights and optimizer state, and the losses, with an uninterrupted run — by hash.
# Then what must be refused: a new run pointed at a finished run's save directory (overwrite),
# a resume whose newest save is damaged (fallback), and two runs at once on one offload
# directory, which must not touch each other's files.
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
# Every file under a directory, by hash: what a refused run must leave as it was.
tree_hash() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum; }
# `refused NAME PATTERN CMD...`: CMD fails with PATTERN on stderr.
refused() {
  local name=$1 pattern=$2; shift 2
  if "$@" >/dev/null 2>refused.err; then
    failed=$((failed + 1)); echo "trial $name: not refused" >&2
  elif ! grep -q "$pattern" refused.err; then
    failed=$((failed + 1)); echo "trial $name: refused without '$pattern':" >&2; cat refused.err >&2
  else
    return 0
  fi
  return 1
}

# Overwrite: a new run pointed at a finished run's directory is refused, and no byte changes.
before=$(tree_hash straight)
if refused overwrite "already holds saves" "$bin" "${run[@]}" --save-dir straight; then
  if [ "$(tree_hash straight)" = "$before" ] && [ "$(fingerprint straight)" = "$expected" ]; then
    passed=$((passed + 1)); else failed=$((failed + 1)); echo "trial overwrite: files changed" >&2; fi
fi

# Fallback: the newest save damaged (its manifest gone); --resume refuses instead of stepping
# back to the save before and then writing over the damaged folder; the advice it gives (the
# newest whole save, a new --save-dir) finishes the run with the uninterrupted run's state.
cp -r straight damaged
rm "damaged/step-$(printf %06d "$steps")/manifest.json"
before=$(tree_hash damaged)
if refused fallback "damaged saved run" "$bin" train --resume damaged --no-timeline; then
  whole=damaged/step-$(printf %06d $((steps - 1)))
  if [ "$(tree_hash damaged)" = "$before" ] && grep -q "$whole" refused.err \
    && "$bin" train --resume "$whole" --save-dir recovered --no-timeline >/dev/null 2>&1; then
    check recovered
  else
    failed=$((failed + 1)); echo "trial fallback: files changed or the advice did not finish" >&2
  fi
fi

# Two runs, one offload directory, at the same time: each keeps its own scratch file (the
# same per-rank name would have each read the other's bytes), both end with the same state,
# and no scratch file is left behind.
mkdir offload
offloaded=("${run[@]}" --zero 1 --offload-optimizer nvme --offload-dir offload)
"$bin" "${offloaded[@]}" --save-dir two-a >/dev/null 2>two-a.err & a=$!
"$bin" "${offloaded[@]}" --save-dir two-b >/dev/null 2>two-b.err & b=$!
if wait "$a" && wait "$b" && [ "$(fingerprint two-a)" = "$(fingerprint two-b)" ] \
  && [ -z "$(ls -A offload)" ]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "trial two-runs-one-directory failed" >&2; cat two-a.err two-b.err >&2
fi

echo "crash-trials: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
