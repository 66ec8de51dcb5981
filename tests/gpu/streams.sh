#!/usr/bin/env bash
# On the device machine: traces on several streams, like for like. Each trace is replayed by
# vramscope (`replay --backend cuda`, each segment kind) and by PyTorch's caching allocator and
# the cudaMallocAsync pool on the same streams (torch_streams.py); the JSON lines compare peak
# reserved and segments reserved per warm pass. Here, first:
#   cargo build --release --features cuda -p vramscope-cli
#   mkdir -p .gpu/traces && cp target/release/vramscope tests/gpu/torch_streams.py \
#     tests/gpu/streams.sh .gpu/ && strip --strip-debug .gpu/vramscope
#   gunzip -c fixtures/torch/pipeline_streams.trace.json.gz > .gpu/traces/pipeline_streams.trace.json
#   OUT=.gpu/traces python3 tests/gpu/random_streams.py 0 24   # 12 of them on 2 to 4 streams
# then with the `device` tool (carry [".gpu"]): bash .gpu/streams.sh > $OUT/streams.txt 2>&1.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
WARM=${WARM:-5}
for f in traces/*.trace.json; do
  n=$(python3 -c 'import json,sys; print(len({e[3] if len(e) > 3 else 0 for e in json.load(open(sys.argv[1]))["events"]}))' "$f")
  [ "$n" -gt 1 ] || continue
  for seg in malloc virtual; do
    echo "== replay $(basename $f .trace.json) $seg"
    VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./vramscope replay "$f" --backend cuda --warm "$WARM" --record off --json 2>&1
  done
done
echo "== torch_streams.py"
timeout 400 python3 torch_streams.py traces "$((WARM + 1))" 2>&1 | grep -v Warning
