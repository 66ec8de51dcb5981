#!/usr/bin/env bash
# On the device machine: traces replayed by two vramscope binaries (the code before a change and
# after it), each segment kind, beside PyTorch's caching allocator, the cudaMallocAsync pool and
# cudaMalloc (torch_replay.py, one stream), and the CUDA tests of the new code with each segment
# kind. Used for "Reclaim in proportion" in BENCHMARKS.md. Here, first:
#   cargo build --release --features cuda -p vramscope-cli                  # the change
#   (cd <worktree of the commit before> && CARGO_TARGET_DIR=/tmp/old \
#      cargo build --release --features cuda -p vramscope-cli)             # the code before
#   cargo test --release --features cuda --test cuda --no-run               # prints the test binary
#   mkdir -p .gpu/traces
#   cp target/release/vramscope .gpu/vramscope-new && cp /tmp/old/release/vramscope .gpu/vramscope-old
#   cp target/release/deps/cuda-<hash> .gpu/cuda_tests && strip --strip-debug .gpu/vramscope-* .gpu/cuda_tests
#   for f in fixtures/torch/*.trace.json.gz; do gunzip -c $f > .gpu/traces/$(basename $f .gz); done
#   OUT=.gpu/traces python3 tests/gpu/random_streams.py 2000 2048   # then keep the one-stream ones
#   cp ../shared/tools/torch_replay.py tests/gpu/reclaim.sh .gpu/
# then with the `device` tool (carry [".gpu"]): bash .gpu/reclaim.sh > $OUT/reclaim.txt 2>&1.
# SEGS=virtual (or malloc) replays with one segment kind only, for a change that cannot touch
# the other (the CUDA tests still run with both).
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
WARM=${WARM:-5}
for seg in malloc virtual; do
  echo "== cuda tests, VRAMSCOPE_CUDA_SEGMENTS=$seg"
  VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 120 ./cuda_tests 2>&1 | grep -E "test result|FAILED|panicked"
done
for f in traces/*.trace.json; do
  for seg in ${SEGS:-malloc virtual}; do
    for v in old new; do
      echo "== replay $(basename "$f" .trace.json) $seg $v"
      VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 "./vramscope-$v" replay "$f" --backend cuda --warm "$WARM" \
        --record off --json 2>&1
    done
  done
done
echo "== torch_replay.py"
timeout 420 python3 torch_replay.py traces 2>&1 | grep -v Warning
