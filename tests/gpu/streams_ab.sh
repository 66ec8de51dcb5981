#!/usr/bin/env bash
# On the device machine: two builds of the CLI side by side on the five fixture traces on
# several streams (or on those NAMES lists), interleaved, the order flipped each round,
# recording off and default, both segment kinds, each round followed by torch_streams.py
# (PyTorch and the pool on the traces' own streams), three rounds. Used for "Loans given back
# unasked" and "Extras kept for the next block" (BENCHMARKS.md). Here, first:
#   git worktree add /tmp/base <base commit>
#   (cd /tmp/base && RUSTFLAGS= CARGO_TARGET_DIR=/work/main/target/userbase \
#      cargo build --release --features cuda -p vramscope-cli)
#   RUSTFLAGS= CARGO_TARGET_DIR=target/user cargo build --release --features cuda -p vramscope-cli
#   mkdir -p .gpu/ab && cp target/userbase/release/vramscope .gpu/ab/vramscope-base
#   cp target/user/release/vramscope .gpu/ab/vramscope-new
#   cp tests/gpu/streams_ab.sh tests/gpu/torch_streams.py .gpu/ab/ && strip --strip-debug .gpu/ab/vramscope-*
# then with the `device` tool (carry [".gpu/ab"]): bash .gpu/ab/streams_ab.sh > $OUT/ab.log 2>&1
set -u
cd "$(dirname "$0")"
mkdir -p traces
# NAMES: the fixture traces to replay (default the five above).
for n in ${NAMES:-ensemble_streams pipeline_streams ema_side_stream grad_buckets_streams prefetch_side_stream}; do
  gunzip -c "../../fixtures/torch/$n.trace.json.gz" > "traces/$n.trace.json"
done
for round in 1 2 3; do
  if [ $((round % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for t in traces/*.trace.json; do
    n=$(python3 -c "import json;print(len(json.load(open('$t'))['events']))")
    warm=$(( 300000 / n )); [ $warm -lt 5 ] && warm=5; [ $warm -gt 1000 ] && warm=1000
    for b in $order; do for seg in virtual malloc; do for rec in off fast; do
      echo "== $b $(basename "$t" .trace.json) $seg $rec $round"
      VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./vramscope-$b replay "$t" --backend cuda --warm $warm --record $rec --json
    done; done; done
  done
  timeout 120 python3 torch_streams.py traces 2>&1 | grep -v Warning
done
