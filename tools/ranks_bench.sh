#!/usr/bin/env bash
# Times `vramscope ranks` over rank files beside `summary` of each, three rounds: the ranks
# table of "Reading snapshots" in BENCHMARKS.md.
#
#   python3 tools/big_pickles.py 100 /tmp/big                     # one 100 MB file per kind
#   mkdir -p /tmp/ranks8 && for i in 0 1 2 3 4 5 6 7; do
#       ln -sf /tmp/big/kv_cache_never_reset.default.pickle /tmp/ranks8/rank$i.pickle; done
#   bash tools/ranks_bench.sh /tmp/ranks8/*.pickle
#
# Each line: the seconds of `summary` of every file, then those of `ranks` over all of them
# and its peak memory in KB (`/usr/bin/time -f "%e %M"`, release build, output discarded).
set -euo pipefail
bin=${VRAMSCOPE:-target/release/vramscope}
[ $# -gt 0 ] || { echo "usage: ranks_bench.sh FILE..." >&2; exit 2; }
for round in 1 2 3; do
    line="summaries:"
    for f in "$@"; do
        line="$line $( { /usr/bin/time -f %e "$bin" summary "$f" > /dev/null; } 2>&1 )"
    done
    echo "$line | ranks: $( { /usr/bin/time -f "%e s, %M KB" "$bin" ranks "$@" > /dev/null; } 2>&1 )"
done
