#!/usr/bin/env bash
# On the device machine: the CUDA tests (both kinds of segments, parallel as `cargo test` runs
# them), then every fixture trace replayed through vramscope with each segment kind, recording
# off and with the default recording, then through PyTorch's caching allocator, cudaMallocAsync
# and cudaMalloc (../shared/tools/torch_replay.py), in three rounds; then the pair (one
# allocation and free, cached) and the threads (1 to 16 threads, each on its own stream or all
# on one), vramscope as users build and with frame pointers, beside PyTorch's allocator
# (../shared/tools/torch_threads.py). table.py prints the whole table from this log. Here, first:
#   cargo build --release --features cuda -p vramscope-cli
#   cargo test --release --features cuda --test cuda --no-run      # prints the test binary
#   cargo bench --features cuda --bench cuda --no-run              # prints the pair bench
#   (cd fixtures/user-bench && RUSTFLAGS= cargo bench --features cuda --bench threads --no-run &&
#    RUSTFLAGS="-C force-frame-pointers=yes" CARGO_TARGET_DIR=target/fp \
#      cargo bench --features cuda --bench threads --no-run)
#   mkdir -p .gpu && cp target/release/deps/cuda-<hash> .gpu/cuda_tests
#   cp target/release/deps/cuda-<other hash> .gpu/cuda_bench
#   cp fixtures/user-bench/target/release/deps/threads-<hash> .gpu/threads_user
#   cp fixtures/user-bench/target/fp/release/deps/threads-<hash> .gpu/threads_fp
#   cp target/release/vramscope ../shared/tools/torch_replay.py ../shared/tools/torch_threads.py \
#     tests/gpu/run.sh tests/gpu/table.py tests/gpu/torch_streams.py .gpu/
#   strip --strip-debug .gpu/cuda_tests .gpu/cuda_bench .gpu/vramscope .gpu/threads_*
# then with the `device` tool (carry [".gpu"]): bash .gpu/run.sh > $OUT/log.txt 2>&1, and
# python3 tests/gpu/table.py log.txt here. A part whose binary is missing is left out.
# BENCHMARKS.md ("On the GPU") keeps the latest table with the GPU's name.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
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
mkdir -p traces && for f in "${TRACES:-../fixtures/torch}"/*.trace.json*; do  # gzipped in the tree
  case $f in *.gz) gunzip -c "$f" > "traces/$(basename "$f" .gz)" ;; *) cp "$f" traces/ ;; esac
done
# Rounds, each every vramscope replay then torch_replay.py: the host's speed changes from one
# second to the next (up to 2x, BENCHMARKS.md), so each side is run in every round and
# table.py compares medians of rounds.
# vramscope's warm passes: at least 5, and about 300,000 operations in all (some tens of
# milliseconds), so that the median of one replay spans more than a moment of the host's speed
# (a trace of 401 operations ran its 5 passes in under a millisecond). Each pass's time is
# printed to 0.1 ns.
compact='import json,sys
t=sys.stdin.read()
try:
    r=json.loads(t); r["warm_ns_per_op"]=[round(x,1) for x in r["warm_ns_per_op"]]; print(json.dumps(r))
except ValueError: print(t)'
for round in $(seq "${ROUNDS:-3}"); do
  for f in traces/*.trace.json; do
    warm=$(python3 -c 'import json,sys; n=len(json.load(open(sys.argv[1]))["events"]); print(max(5, min(1000, 300000 // max(n, 1))))' "$f")
    for seg in malloc virtual; do for rec in off fast; do
      echo "== replay $(basename $f .trace.json) $seg $rec $round"
      VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./vramscope replay "$f" --backend cuda --warm $warm --record $rec --json 2>&1 | python3 -c "$compact"
    done; done
  done
  echo "== torch_replay.py $round"
  timeout 300 python3 torch_replay.py traces 2>&1 | grep -v Warning | tail -n 200
  # The traces on several streams, through PyTorch and the pool on those streams.
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
