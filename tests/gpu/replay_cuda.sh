#!/usr/bin/env bash
# On the device machine, beside a `vramscope` binary built with the cuda feature: replays every
# DIR/*.trace.json through vramscope on CUDA with virtual and with `cuMemAlloc` segments, 4 warm
# passes, recording off, a JSON line each after an "== replay NAME KIND" line (what
# tests/gpu/table.py and the README's logs read). Used by december.sh and staggered.sh.
#   bash replay_cuda.sh DIR
set -u
cd "$(dirname "$0")"
for f in "$1"/*.trace.json; do
  for seg in virtual malloc; do
    echo "== replay $(basename "$f") $seg"
    VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 40 ./vramscope replay "$f" --backend cuda --warm 4 --record off --json 2>&1
  done
done
