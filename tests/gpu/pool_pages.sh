#!/usr/bin/env bash
# On the device machine: where the cudaMallocAsync pool's low peaks come from. Replays every
# trace through the pool recording its addresses (`pool_pages.py`), then through vramscope with
# each segment kind (recording off, 4 warm passes); `python3 tests/gpu/pool_pages.py --table LOG`
# prints the comparison. Used for "Where the pool's peak comes from" in BENCHMARKS.md. Here:
#   cargo build --release --features cuda -p vramscope-cli
#   mkdir -p .gpu/pp/traces && cp target/release/vramscope .gpu/pp/ && strip --strip-debug .gpu/pp/vramscope
#   cp fixtures/torch/*.trace.json.gz .gpu/pp/traces/    # gzipped or not
#   OUT=.gpu/pp/traces python3 tests/gpu/random_streams.py 2000 2048   # and any other seeds
#   cp tests/gpu/pool_pages.py tests/gpu/pool_pages.sh .gpu/pp/
# then with the `device` tool (carry [".gpu"]): bash .gpu/pp/pool_pages.sh > $OUT/pool-pages.log 2>&1
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== pool_pages.py"
timeout 300 python3 pool_pages.py traces/*.trace.json* 2>&1 | grep -v Warning
for f in traces/*.trace.json*; do
  for seg in malloc virtual; do
    echo "== replay $(basename "$f") $seg"
    VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./vramscope replay "$f" --backend cuda --warm 4 \
      --record off --json 2>&1
  done
done
