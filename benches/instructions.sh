#!/usr/bin/env bash
# Instructions per warm operation of a trace's replay on the sim backend (virtual segments'
# rules, the GPU's fragmentation ceiling), counted by valgrind (callgrind) inside the replay's
# passes only: two runs of 4 and 12 warm passes, the difference over 8 passes' operations.
# Unlike a time, the count does not move with the host's speed, so a change to the allocator
# compares before and after exactly. Needs valgrind and the release CLI:
#   cargo build --release -p vramscope-cli && bash benches/instructions.sh leaky_train gpt2_train
# RP=false counts the rules of cuMemAlloc segments (no page release).
set -eu
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/vramscope}
for t in "$@"; do
  f=fixtures/torch/$t.trace.json.gz
  ops=$(python3 -c "import gzip,json,sys; print(len(json.load(gzip.open(sys.argv[1]))['events']))" "$f")
  r=()
  for w in 4 12; do
    r+=("$(valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect='*run_pass*' \
      "$BIN" replay "$f" --record off --warm $w --config "release_pages:${RP:-true},fragmentation_limit_max:16" 2>&1 |
      awk '/refs:/ {gsub(",", "", $4); print $4}')")
  done
  python3 -c "import sys; print(sys.argv[1], round((int(sys.argv[3]) - int(sys.argv[2])) / 8 / int(sys.argv[4]), 1))" "$t" "${r[0]}" "${r[1]}" "$ops"
done
