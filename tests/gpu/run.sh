#!/usr/bin/env bash
# On the device machine: the CUDA tests (both kinds of segments, parallel as `cargo test` runs
# them), then every fixture trace replayed through vramscope with each segment kind, recording
# off and with the default recording (two runs each), then through PyTorch's caching allocator,
# cudaMallocAsync and cudaMalloc (../shared/tools/torch_replay.py), then table.py prints the
# whole table from this log. Here, first:
#   cargo build --release --features cuda -p vramscope-cli
#   cargo test --release --features cuda --test cuda --no-run      # prints the test binary
#   mkdir -p .gpu && cp target/release/deps/cuda-<hash> .gpu/cuda_tests
#   cp target/release/vramscope ../shared/tools/torch_replay.py tests/gpu/run.sh tests/gpu/table.py .gpu/
#   strip .gpu/cuda_tests .gpu/vramscope
# then with the `device` tool (carry [".gpu"]): bash .gpu/run.sh > $OUT/log.txt 2>&1
# BENCHMARKS.md ("On the GPU") keeps the latest table with the GPU's name.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for seg in malloc virtual; do
  echo "== cuda tests, $seg segments"
  VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 120 ./cuda_tests 2>&1 | grep -E "^test |test result|panicked" | head -30
done
mkdir -p traces && cp ../fixtures/torch/*.trace.json traces/
for f in traces/*.trace.json; do
  for seg in malloc virtual; do for rec in off fast; do for i in 1 2; do
    echo "== replay $(basename $f .trace.json) $seg $rec $i"
    VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./vramscope replay "$f" --backend cuda --warm 5 --record $rec --json; echo
  done; done; done
done
echo "== torch_replay.py"
timeout 300 python3 torch_replay.py traces 2>&1 | grep -v Warning | tail -20
