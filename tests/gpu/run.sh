#!/usr/bin/env bash
# On the device machine: the CUDA tests (both kinds of segments, parallel as `cargo test` runs
# them), then every fixture trace replayed through vramscope with each segment kind, recording
# off and with the default recording, then through PyTorch's caching allocator, cudaMallocAsync
# and cudaMalloc (the code of ../shared/tools/torch_replay.py), each trace's two sides back to
# back (paired.py), in three rounds; then the pair (one
# allocation and free, cached) and the threads (1 to 16 threads, each on its own stream or all
# on one), vramscope as users build and with frame pointers, beside PyTorch's allocator
# (../shared/tools/torch_threads.py). table.py prints the whole table from this log. Here, first:
#   cargo build --release --features cuda -p vramscope-cli
#   cargo test --release --features cuda --test cuda --no-run      # prints the test binary
#   cargo bench --features cuda --bench cuda --no-run              # prints the pair bench
#   (cd fixtures/user-bench && RUSTFLAGS= cargo bench --features cuda --bench threads --no-run &&
#    RUSTFLAGS="-C force-frame-pointers=yes" CARGO_TARGET_DIR=target/fp \
#      cargo bench --features cuda --bench threads --no-run)
#   mkdir -p .gpu && cp target/release/deps/cuda-<hash> .gpu/cuda_tests   # what `cargo test` printed
#   cp target/release/deps/cuda-<other hash> .gpu/cuda_bench            # what `cargo bench` printed
#   (both are named cuda-<hash>; `.gpu/cuda_tests --list` ends in "16 tests, 0 benchmarks")
#   cp fixtures/user-bench/target/release/deps/threads-<hash> .gpu/threads_user
#   cp fixtures/user-bench/target/fp/release/deps/threads-<hash> .gpu/threads_fp
#   cp target/release/vramscope ../shared/tools/torch_replay.py ../shared/tools/torch_threads.py \
#     tests/gpu/run.sh tests/gpu/paired.py tests/gpu/table.py tests/gpu/torch_streams.py .gpu/
#   strip --strip-debug .gpu/cuda_tests .gpu/cuda_bench .gpu/vramscope .gpu/threads_*
# then with the `device` tool (carry [".gpu"]): bash .gpu/run.sh > $OUT/log.txt 2>&1, and
# python3 tests/gpu/table.py log.txt here. A part whose binary is missing is left out.
# BENCHMARKS.md ("On the GPU") keeps the latest table with the GPU's name.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# Swapped, the suite runs as ignored benchmarks and says nothing: say so.
if [ -x cuda_tests ] && ! ./cuda_tests --list 2>/dev/null | grep -q ': test$'; then
  echo "== cuda_tests lists no tests: is it the pair bench? (see the packing notes at the top)"
fi
for seg in malloc virtual default; do
  [ -x cuda_tests ] || break
  echo "== cuda tests, $seg segments"
  if [ $seg = default ]; then
    (unset VRAMSCOPE_CUDA_SEGMENTS; timeout 120 ./cuda_tests 2>&1 | grep -E "^test |test result|panicked" | head -30)
  else
    VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 120 ./cuda_tests 2>&1 | grep -E "^test |test result|panicked" | head -30
  fi
done
# TRACES=DIR (relative to this script's folder) replays the traces there instead of the fixtures'.
rm -rf traces && mkdir -p traces && for f in "${TRACES:-../fixtures/torch}"/*.trace.json*; do  # gzipped in the tree
  case $f in *.gz) gunzip -c "$f" > "traces/$(basename "$f" .gz)" ;; *) cp "$f" traces/ ;; esac
done
# Rounds (ROUNDS, default 3), each trace's replays through vramscope and PyTorch back to back
# (paired.py): the host's speed changes from one minute to the next (up to 2x, BENCHMARKS.md),
# so table.py compares each round's pair, seconds apart, and takes the median of the rounds'
# ratios. vramscope's warm passes: at least 5, and about 300,000 operations in all (some tens
# of milliseconds), so that one replay spans more than a moment of the host's speed.
timeout 1800 python3 paired.py traces "${ROUNDS:-3}" 2>&1 | grep -v Warning
# The traces on several streams, through PyTorch and the pool on those streams (peaks and
# driver calls; their time is not like for like).
for round in $(seq "${ROUNDS:-3}"); do
  [ -f torch_streams.py ] && timeout 120 python3 torch_streams.py traces 2>&1 | grep -v Warning
done
if [ -x cuda_bench ]; then
  echo "== pair bench"; timeout 200 ./cuda_bench --bench 2>&1 | grep -v "^$"
fi
for i in 1 2; do for b in user fp; do
  [ -x threads_$b ] || continue
  echo "== threads $b $i"; timeout 200 ./threads_$b --backend cuda --secs 0.5 --recording off 2>&1
  timeout 200 ./threads_$b --backend cuda --secs 0.5 --recording default 2>&1
done; done
if [ -f torch_threads.py ]; then echo "== torch_threads.py"; timeout 300 python3 torch_threads.py 2>&1 | grep -v Warning; fi
