#!/usr/bin/env bash
# Runs the library's test binaries under AddressSanitizer (nightly, -Zsanitizer=address, with
# LeakSanitizer) and under valgrind memcheck (the dev-profile binaries, definite leaks are
# errors). Not part of CI (about 25 minutes on the 2-core machine); results in RELIABILITY.md.
#
#   bash tools/sanitize.sh [asan|valgrind|both]
#
# Skipped under ASan: `ui` (runs cargo) and `cuda` (needs a GPU). The deep-stack test of
# tests/mem_tests/record.rs runs a 128 KiB thread on purpose; ASan's larger frames overflow it, so it is
# skipped there and run under valgrind instead; the pickle-bomb test's 5 s bound is skipped
# there too. Skipped under valgrind: the slowest tests (bad_input, faults, load_leaks: ASan
# runs them), and keepalive_loom, whose loom scheduler switches stacks in a way valgrind
# reports as invalid reads (its false positives; ASan runs it).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-both}
status=0

if [[ $mode == asan || $mode == both ]]; then
  target=target/asan
  mkdir -p "$target"
  RUSTFLAGS="-Zsanitizer=address" cargo +nightly test --target x86_64-unknown-linux-gnu \
    --target-dir "$target" -p vramscope --lib --tests --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("executable") and m["target"]["name"] not in ("ui", "cuda"): print(m["target"]["name"], m["executable"])' \
    > "$target/bins.txt" || exit 1
  while read -r name bin; do
    skip=()
    [[ $name == mem_tests ]] && skip=(--skip record::allocations_from_deep_and_small_stacks_never_crash)
    # It also checks a time bound (5 s), which ASan's instrumentation of a debug build exceeds.
    [[ $name == reports ]] && skip=(--skip bad_input::pickle_bombs_and_cycles_are_refused)
    if ASAN_OPTIONS=detect_leaks=1 "$bin" --test-threads 2 "${skip[@]}" > "$target/$name.log" 2>&1; then
      echo "asan     ok    $name: $(grep -E '^test result' "$target/$name.log" | tail -1)"
    else
      echo "asan     FAIL  $name (see $target/$name.log)"; status=1
    fi
  done < "$target/bins.txt"
fi

if [[ $mode == valgrind || $mode == both ]]; then
  mkdir -p target/valgrind
  cargo test -p vramscope --lib --tests --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("executable") and m["target"]["name"] not in ("ui", "cuda", "keepalive_loom"): print(m["target"]["name"], m["executable"])' \
    > target/valgrind/bins.txt || exit 1
  while read -r name bin; do
    skip=()
    [[ $name == reports ]] && skip=(--skip bad_input::)
    [[ $name == allocator ]] && skip=(--skip faults::)
    [[ $name == alone ]] && skip=(--skip load_leaks::)
    if PROPTEST_CASES=16 valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
        "$bin" --test-threads 2 "${skip[@]}" > "target/valgrind/$name.log" 2>&1; then
      echo "valgrind ok    $name: $(grep -E '^test result' "target/valgrind/$name.log" | tail -1)"
    else
      echo "valgrind FAIL  $name (see target/valgrind/$name.log)"; status=1
    fi
  done < target/valgrind/bins.txt
fi
exit $status
