#!/usr/bin/env bash
# The MPI communicator against the in-process one: the same runs under `mpirun -n N` and with
# `--data-parallel N` (threads) must report the same losses, bit for bit, the same bytes per
# category on rank 0 and the same collectives (calls and elements), over 20 steps — DDP at 2 and
# 3 ranks, ZeRO-1 at 2, ZeRO-2 at 3, ZeRO-3 at 2 and 4 with AdamW; SGD with momentum at ZeRO-1
# and 2; LAMB at ZeRO-3; offload: ZeRO-2 with optimizer states in files, ZeRO-3 with states and
# parameters in host memory. Tensor parallelism at 2 and 4 ranks (fp32, bf16-mixed) against
# threads and the unsplit layout. Then faults, each bounded in time: a rank that cannot read its data,
# that returns an error or panics at step 3, ends the job non-zero within 5 s of a healthy run's
# time to step 3, naming the rank; a rank that sleeps is ended by the watchdog
# (--collective-timeout) within the deadline + 5 s; ranks that call different collectives end
# with the mismatch named, not a hang. Then the edges of a job: a save of 2 ranks resumed by 1
# keeps the effective batch (the job's size is applied before the resume checks); Ctrl-C at
# mpirun saves the run and rank 0 says how to continue; --auto is refused, and when it was only
# the default rank 0 says the configured strategy runs.
#
# Usage: scripts/mpi-check.sh HEADROOM_BINARY_BUILT_WITH_--features_mpi
# Needs Open MPI's mpirun (Debian: openmpi-bin). Runs as root and oversubscribed, as CI does.
set -euo pipefail
bin_arg=${1:?usage: scripts/mpi-check.sh HEADROOM_BINARY (built with cargo build --features mpi)}
bin=$(cd "$(dirname "$bin_arg")" && pwd)/$(basename "$bin_arg")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
base=(train --model gpt-tiny --dropout 0 --micro-batch 2 --eval-batches 1
      --no-timeline --no-auto --deterministic)
run=("${base[@]}" --steps 20)
same() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
def counts(r):
    c = dict(r["communication"]["counts"])
    c.pop("busy_ns")
    return c
ok = (a["losses"] == b["losses"]
      and a["peak_bytes_by_category"] == b["peak_bytes_by_category"]
      and counts(a) == counts(b))
sys.exit(0 if ok else 1)
PY
}
passed=0; failed=0
for case in "2 0 adamw" "3 0 adamw" "2 1 adamw" "3 2 adamw" "2 3 adamw" "4 3 adamw" \
  "3 1 sgd-momentum" "4 2 sgd-momentum" "3 3 lamb" \
  "2 2 adamw --offload-optimizer nvme --offload-dir $work/offload" \
  "2 3 adamw --offload-optimizer cpu --offload-params cpu"; do
  set -- $case
  ranks=$1 stage=$2 optimizer=$3
  shift 3
  name="$ranks-$stage-$optimizer${1:+-offload-$2}"
  timeout 120 mpirun -n "$ranks" "$bin" "${run[@]}" --zero "$stage" --optimizer "$optimizer" "$@" \
    --json-report "mpi-$name.json" >/dev/null 2>"mpi-$name.err" || { cat "mpi-$name.err" >&2; }
  timeout 120 "$bin" "${run[@]}" --zero "$stage" --optimizer "$optimizer" "$@" \
    --data-parallel "$ranks" --json-report "threads-$name.json" >/dev/null 2>&1 || true
  if [ -f "mpi-$name.json" ] && same "mpi-$name.json" "threads-$name.json"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "mpirun -n $ranks --zero $stage --optimizer $optimizer $* differs from threads" >&2
  fi
done
# Tensor parallelism (--tensor-parallel N, gpt-tiny with 4 heads so 4 ranks split it): the
# same split under mpirun -n N and on N threads reports the same losses and rank-0 bytes per
# category, and its losses are bitwise the unsplit layout's (--tensor-parallel 1), in fp32 and
# bf16-mixed.
split_same() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a, b, one = (json.load(open(p)) for p in sys.argv[1:4])
ok = (a["losses"] == b["losses"] == one["losses"]
      and a["peak_bytes_by_category"] == b["peak_bytes_by_category"])
sys.exit(0 if ok else 1)
PY
}
for precision in fp32 bf16-mixed; do
  split=("${base[@]}" --steps 6 --heads 4 --precision "$precision" --optimizer adamw)
  timeout 120 "$bin" "${split[@]}" --tensor-parallel 1 --json-report "tp1-$precision.json" \
    >/dev/null 2>&1 || true
  for ranks in 2 4; do
    name="tp$ranks-$precision"
    timeout 120 mpirun -n "$ranks" "$bin" "${split[@]}" --tensor-parallel "$ranks" \
      --json-report "mpi-$name.json" >/dev/null 2>"mpi-$name.err" || { cat "mpi-$name.err" >&2; }
    timeout 120 "$bin" "${split[@]}" --tensor-parallel "$ranks" \
      --json-report "threads-$name.json" >/dev/null 2>&1 || true
    if [ -f "mpi-$name.json" ] && [ -f "tp1-$precision.json" ] \
      && split_same "mpi-$name.json" "threads-$name.json" "tp1-$precision.json"; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      echo "mpirun -n $ranks --tensor-parallel $ranks ($precision) differs from threads or from the unsplit run" >&2
    fi
  done
done
# A failing rank (rank 1 cannot read its data) ends the whole job, non-zero, with its error,
# within seconds: it leaves MPI without finalizing instead of hanging the others.
cat > rank1-fails.sh <<'SH'
#!/usr/bin/env bash
if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$@" --data /nonexistent.txt; else exec "$@"; fi
SH
chmod +x rank1-fails.sh
start=$(date +%s)
if timeout 60 mpirun -n 2 ./rank1-fails.sh "$bin" "${run[@]}" >fail.out 2>&1; then rc=0; else rc=$?; fi
took=$(( $(date +%s) - start ))
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 30 ] && grep -q "cannot read the corpus file" fail.out; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "a failing rank did not end the job cleanly (exit $rc after $took s)" >&2
  cat fail.out >&2
fi
# Injected faults (HEADROOM_FAULT=RANK:KIND@STEP): against a healthy run's time to step 3.
start=$(date +%s%N)
timeout 120 mpirun -n 3 "$bin" "${base[@]}" --zero 2 --steps 3 >/dev/null 2>healthy.err \
  || { cat healthy.err >&2; }
healthy_ms=$(( ($(date +%s%N) - start) / 1000000 ))
fault() {  # fault SPEC BOUND_MS EXPECTED_TEXT [flags…]
  local spec=$1 bound=$2 text=$3 rc t0 took
  shift 3
  t0=$(date +%s%N)
  if HEADROOM_FAULT=$spec timeout 120 mpirun -n 3 "$bin" "${base[@]}" --zero 2 --steps 8 "$@" \
    >fault.out 2>&1; then rc=0; else rc=$?; fi
  took=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt "$bound" ] && grep -qF "$text" fault.out; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "HEADROOM_FAULT=$spec: exit $rc after $took ms (bound $bound ms, healthy $healthy_ms ms to step 3), expected '$text'" >&2
    cat fault.out >&2
  fi
}
fault 1:error@3 $((healthy_ms + 5000)) "rank 1: injected fault at step 3"
fault 1:panic@3 $((healthy_ms + 5000)) "rank 1: panicked"
fault 1:sleep@3 $((healthy_ms + 3000 + 5000)) "still waiting after 3s" --collective-timeout 3
# Rank 1 shards its optimizer state, rank 0 does not: their first gradient collectives differ.
cat > rank1-differs.sh <<'SH'
#!/usr/bin/env bash
if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$@" --zero 1; else exec "$@" --zero 0; fi
SH
chmod +x rank1-differs.sh
if timeout 60 mpirun -n 2 ./rank1-differs.sh "$bin" "${base[@]}" --steps 3 >mismatch.out 2>&1; then rc=0; else rc=$?; fi
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "mismatched" mismatch.out; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "mismatched collectives under mpirun: exit $rc" >&2; cat mismatch.out >&2
fi
# A 2-rank save resumed by one rank accumulates twice as many micro-batches, and says so.
timeout 120 mpirun -n 2 "$bin" "${base[@]}" --steps 2 --save-every 2 --save-dir "$work/two" \
  >/dev/null 2>two.err || { cat two.err >&2; }
if timeout 120 mpirun -n 1 "$bin" train --resume "$work/two" --steps 3 --no-timeline \
  >one.out 2>&1 && grep -q "resume: changed accumulation: 1 → 2" one.out \
  && grep -q "resume: changed data_parallel: 2 → 1" one.out; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "a 2-rank save resumed under mpirun -n 1 kept its split" >&2; cat one.out >&2
fi
# Ctrl-C at mpirun: it passes SIGTERM to the ranks and kills them a second later (its exit
# status is then its own, 1); the save is made and the way to continue said before the outputs.
setsid mpirun -n 2 "$bin" "${base[@]}" --steps 1000000 --save-dir "$work/stopped" >stop.out 2>&1 &
launcher=$!
for _ in $(seq 1 600); do grep -q "^step 20/" stop.out 2>/dev/null && break; sleep 0.1; done
kill -INT "$launcher"
wait "$launcher" || true
step=$(sed -n 's/^SIGTERM after step \([0-9]*\) of 1000000: saved to .*; continue with: headroom train --resume .*stopped$/\1/p' stop.out)
if [ -n "$step" ] && timeout 120 mpirun -n 2 "$bin" train --resume "$work/stopped" \
  --steps $((step + 2)) --no-timeline >resumed.out 2>&1; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "Ctrl-C at mpirun: no resume hint, or the save did not resume" >&2
  cat stop.out resumed.out >&2 2>/dev/null || true
fi
# --auto: refused under mpirun when asked for; said when it was only the default.
tiny=(train --model gpt-tiny --steps 1 --eval-batches 1 --no-timeline)
if timeout 60 mpirun -n 2 "$bin" "${tiny[@]}" --auto >auto.out 2>&1; then rc=0; else rc=$?; fi
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q -- "--auto under mpirun -n 2" auto.out \
  && timeout 120 mpirun -n 2 "$bin" "${tiny[@]}" >default.out 2>&1 \
  && [ "$(grep -c "auto: not under mpirun" default.out)" -eq 1 ]; then
  passed=$((passed + 1))
else
  failed=$((failed + 1)); echo "--auto under mpirun: not refused, or the default not said once" >&2
  cat auto.out default.out >&2 2>/dev/null || true
fi
echo "mpi-check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
