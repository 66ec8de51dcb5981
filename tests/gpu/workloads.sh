#!/usr/bin/env bash
# On the device machine: records the workloads of fixtures/torch/workloads.py (the six first ones,
# or those named as arguments), then replays
# each through vramscope (both segment kinds, two runs each, recording off) and through PyTorch's
# caching allocator, cudaMallocAsync and cudaMalloc (../shared/tools/torch_replay.py). Here:
#   cargo build --release --features cuda -p vramscope-cli
#   mkdir -p .gpu && cp target/release/vramscope ../shared/tools/torch_replay.py tests/gpu/workloads.sh .gpu/
#   strip .gpu/vramscope
# then with the `device` tool (carry [".gpu"]): bash .gpu/workloads.sh [NAME...] > $OUT/log.txt
# The traces come back in $OUT/new_traces.tar.xz; the figures are in BENCHMARKS.md.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
mkdir -p new
OUT=new timeout 300 python3 ../fixtures/torch/workloads.py "$@" 2>&1 | grep -v Warning
for f in new/*.trace.json; do
  for seg in malloc virtual; do for i in 1 2; do
    echo "== $(basename $f) $seg run $i"
    VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./vramscope replay $f --backend cuda --warm 5 --json; echo
  done; done
done
echo "== torch_replay.py"
timeout 240 python3 torch_replay.py new 2>&1 | grep -v Warning | tail -12
tar cJf "$OUT/new_traces.tar.xz" new
