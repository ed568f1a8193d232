#!/usr/bin/env bash
# DDP and ZeRO-1/2/3 measured: step time, throughput, what a rank sends per step against the
# ZeRO paper's volume, the time inside collectives and each rank's peak against the dry run's
# prediction, at N = 1, 2, 4 ranks on threads and (when mpirun is there) under MPI; then the
# deepest GPT of width 512 that fits 256 MiB per rank at 4 ranks, per stage. Prints markdown
# tables (docs/benchmarks.md records a run).
#
# Usage: scripts/bench-zero.sh HEADROOM_BINARY   (a release build; with --features mpi for MPI)
set -euo pipefail
bin_arg=${1:?usage: scripts/bench-zero.sh HEADROOM_BINARY (cargo build --release -p headroom [--features mpi])}
bin=$(cd "$(dirname "$bin_arg")" && pwd)/$(basename "$bin_arg")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
run=(train --model gpt-small --no-auto --precision fp32 --micro-batch 4 --steps 12
     --eval-every 0 --eval-batches 1 --no-timeline)
have_mpi=0
if command -v mpirun >/dev/null && "$bin" --version >/dev/null 2>&1 \
  && mpirun -n 1 "$bin" train --model gpt-tiny --no-auto --steps 1 --eval-batches 1 \
    --no-timeline --json-report probe.json >/dev/null 2>&1 \
  && [ -f probe.json ]; then
  have_mpi=1
fi
row() {  # row TRANSPORT N ZERO REPORT
  python3 - "$@" <<'PY'
import json, statistics, sys
transport, n, zero, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
r = json.load(open(path))
steps = r["step_times_s"][2:] or r["step_times_s"]
step = statistics.median(steps)
tokens = 4 * 128 * n / step
c = r.get("communication")
sent = f'{c["sent_elements_per_step"]:,.0f} / {c["theory_elements_per_step"]:,.0f}' if c else "–"
share = f'{100 * c["collective_fraction"]:.0f} %' if c else "–"
peaks = [x["peak_allocated_bytes"] for x in r.get("ranks", [])] or [r["peak_allocated_bytes"]]
pred = r.get("predicted_peak_bytes")
same = "yes" if pred is not None and max(peaks) == pred else f"no ({pred})"
stage = "DDP" if zero == 0 else f"ZeRO-{zero}"
print(f"| {stage} | {transport} | {n} | {step:.3f} s | {tokens:,.0f} | {sent} | {share} | "
      f"{max(peaks):,} B | {same} |")
PY
}
echo "| stage | transport | N | median step | tokens/s (all ranks) | elements sent per step / theory | step time in collectives | peak allocated per rank (max) | = dry run |"
echo "|---|---|---|---|---|---|---|---|---|"
"$bin" "${run[@]}" --json-report one.json >/dev/null 2>&1
row threads 1 0 one.json
for zero in 0 1 2 3; do
  for n in 2 4; do
    "$bin" "${run[@]}" --data-parallel "$n" --zero "$zero" --json-report "t-$n-$zero.json" >/dev/null 2>&1
    row threads "$n" "$zero" "t-$n-$zero.json"
    if [ "$have_mpi" = 1 ]; then
      mpirun -n "$n" "$bin" "${run[@]}" --zero "$zero" --json-report "m-$n-$zero.json" >/dev/null 2>&1
      row mpi "$n" "$zero" "m-$n-$zero.json"
    fi
  done
done
echo
echo "| stage | deepest GPT (width 512) that fits 256 MiB per rank at 4 ranks | parameters | its peak reserved |"
echo "|---|---|---|---|"
for zero in 0 1 2 3; do
  best=0; best_line=""; best_params=""
  for layers in $(seq 1 24); do
    out=$("$bin" train --model gpt-small --width 512 --heads 8 --layers "$layers" --seq-len 128 \
      --micro-batch 1 --data-parallel 4 --zero "$zero" --no-auto --steps 0 \
      --device-memory 256MiB --no-timeline 2>&1 || true)
    line=$(grep -m1 '^dry run:' <<<"$out" || true)
    if grep -q '(fits' <<<"$line"; then
      best=$layers; best_line=$line
      best_params=$(grep -m1 -o '([0-9,]* parameters)' <<<"$out" || true)
    else
      break
    fi
  done
  reserved=$(grep -o '[0-9.]* [KMG]iB reserved' <<<"$best_line" || true)
  stage=$([ "$zero" = 0 ] && echo DDP || echo "ZeRO-$zero")
  echo "| $stage | $best layers | ${best_params//[()]/} | ${reserved% reserved} |"
done
