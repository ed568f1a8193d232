#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS (default 60) from the seeds in fuzz/seeds, and prints
# libFuzzer's closing statistics. Needs cargo-fuzz (`cargo install cargo-fuzz`); on a stable
# toolchain RUSTC_BOOTSTRAP=1 lets it pass its -Z flags. Findings land in fuzz/artifacts.
set -euo pipefail
seconds=${1:-60}
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
for target in trace config_json train_toml saved_run; do
  mkdir -p "corpus/$target"
  cp -n seeds/"$target"/* "corpus/$target/" 2>/dev/null || true
  echo "== $target ($seconds s)"
  cargo fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" \
    -rss_limit_mb=2048 -print_final_stats=1 2>&1 |
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb|Done [0-9]+ runs|ERROR|SUMMARY|panicked" || true
done
