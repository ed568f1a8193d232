#!/usr/bin/env bash
# The doctor's HTML page in a real browser: headless Chromium (Debian's package, installed when
# missing) loads the page written by `headroom memory doctor --html` for a loop that keeps its
# loss tensor; the rendered DOM must hold the findings, the console must log no error, and the
# screenshot must not be empty. Usage: scripts/html-check.sh [path/to/headroom]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/headroom}
if ! command -v chromium >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Five steps: 4 + 1 MiB of parameters (train.py:10); per step a 2 MiB activation and 3 MiB of
# logits (train.py:20), a 512-byte loss (train.py:21) never freed, 4 + 1 MiB of gradients.
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
lines = ["import torch"] + [""] * 8 + ["model = Model().cuda()"] + [""] * 9 + [
    "    logits = model(x)", "    loss = F.cross_entropy(logits, y)", "    total_loss += loss",
    "    loss.backward()", "    opt.step()", "    opt.zero_grad()"]
open(f"{d}/train.py", "w").write("\n".join(lines) + "\n")
def user(n): return {"filename": "train.py", "line": n, "name": "main"}
def lib(f, n): return {"filename": f"/usr/lib/python3/site-packages/torch/{f}", "line": 1, "name": n}
ev, nxt, MIB = [], [0], 1 << 20
def alloc(size, frames):
    nxt[0] += 1
    ev.append({"action": "alloc", "addr": nxt[0], "size": size, "frames": frames})
    return nxt[0]
def free(a, frames): ev.append({"action": "free", "addr": a, "frames": frames})
setup = [lib("nn/modules/module.py", "cuda"), user(10)]
fwd = [lib("nn/modules/linear.py", "forward"), user(20)]
alloc(4 * MIB, setup); alloc(MIB, setup)
logits = None
for step in range(5):
    act = alloc(2 * MIB, fwd)
    l = alloc(3 * MIB, fwd)
    if logits: free(logits, [user(20)])
    logits = l
    alloc(512, [lib("nn/functional.py", "cross_entropy"), user(21)])
    g = [alloc(4 * MIB, []), alloc(MIB, [])]
    free(act, [])
    if step == 0:
        for s in (4 * MIB, 4 * MIB, MIB, MIB): alloc(s, [lib("optim/adamw.py", "_multi_tensor_adamw"), user(24)])
    for a in g: free(a, [lib("optim/optimizer.py", "zero_grad"), user(25)])
json.dump(ev, open(f"{d}/trace.json", "w"))
json.dump({"model": "gpt2", "gpu": "A100-80GB", "seq_len": 512, "micro_batch": 8,
           "precision": "bf16-mixed"}, open(f"{d}/run.json", "w"))
PY
"$bin" memory doctor "$dir/trace.json" --source-root "$dir" --side "$dir/run.json" \
  --html "$dir/report.html" >/dev/null
flags=(--headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$dir/profile")
timeout 60 chromium "${flags[@]}" --enable-logging=stderr --v=0 --virtual-time-budget=2000 \
  --dump-dom "file://$dir/report.html" >"$dir/dom.html" 2>"$dir/console.log"
timeout 60 chromium "${flags[@]}" --window-size=1100,2400 --screenshot="$dir/page.png" \
  "file://$dir/report.html" >/dev/null 2>&1
fail() { echo "html-check: $*" >&2; exit 1; }
for text in "a loss (or metric) kept as a tensor with its graph" "train.py:21 (main)" \
  "total_loss += loss" "fix: " "Levers for this run" "first that fits" "<polygon" \
  "no out-of-memory at this capacity" "Largest call sites alive at the peak"; do
  grep -qF -- "$text" "$dir/dom.html" || fail "the rendered page lacks '$text'"
done
if grep -E 'CONSOLE|Uncaught|:ERROR:.*(console|Refused|Failed to load)' "$dir/console.log"; then
  fail "the browser logged errors loading the page"
fi
size=$(stat -c %s "$dir/page.png" 2>/dev/null || echo 0)
[ "$size" -gt 10000 ] || fail "the screenshot is empty ($size bytes)"
echo "html-check: the page renders its findings, no console error, screenshot $size bytes"
