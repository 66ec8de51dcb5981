#!/usr/bin/env bash
# A bounded fuzzing run of every target, as CI runs it: `bash fuzz/run.sh [SECONDS_PER_TARGET]`
# (default 90). Needs the nightly toolchain (`cargo +nightly`); cargo-fuzz is installed if
# missing. Seeds, copied into fuzz/corpus (not committed) where a run keeps what it finds new:
# the small PyTorch fixtures, the hostile inputs and the configuration strings in fuzz/seeds. A crash fails the
# run and leaves its input in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-90}
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: skipped, no nightly toolchain (cargo +nightly) on this machine"
  exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --quiet
fi
cargo +nightly fuzz build -O
# Seeds: the small fixtures (the 2.4 MB ResNet snapshot and the megabyte-sized hostile files
# would slow every mutation down).
small_hostile=$(find ../fixtures/hostile -type f -size -300k | sort | tr '\n' ' ')
declare -A seeds=(
  [snapshot]="../fixtures/torch/leaky_train.snapshot.pickle $small_hostile"
  [replay]="../fixtures/torch/leaky_train.snapshot.pickle"
  [config]="seeds/config/*"
)
mkdir -p logs
for target in snapshot replay config; do
  mkdir -p "corpus/$target"
  # shellcheck disable=SC2086
  cp -n ${seeds[$target]} "corpus/$target/"
  if [ "$target" = replay ]; then  # the targets read bytes as they are: the trace unzipped
    gunzip -c ../fixtures/torch/leaky_train.trace.json.gz >corpus/replay/leaky_train.trace.json
  fi
  echo "fuzz: $target for ${seconds}s"
  # shellcheck disable=SC2086
  status=0
  cargo +nightly fuzz run -O "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    >"logs/$target.log" 2>&1 || status=$?
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)" "logs/$target.log" || true
  if [ "$status" != 0 ]; then
    tail -40 "logs/$target.log" | cut -c1-300
    # What failed, last: CI shows only a log's last lines, and a failed assertion's message can
    # run to megabytes.
    grep -m1 -A1 "panicked at" "logs/$target.log" | cut -c1-300 || true
    echo "fuzz: $target failed (exit $status); the input is in fuzz/artifacts/$target/:"
    ls -l "artifacts/$target/" 2>/dev/null | tail -n +2 | cut -c1-200 || true
    exit 1
  fi
done
