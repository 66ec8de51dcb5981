#!/usr/bin/env bash
# On the device machine: the CUDA tests (both kinds of segments, parallel as `cargo test` runs
# them), then every fixture trace replayed through vramscope with each segment kind, recording
# off and with the default recording, then through PyTorch's caching allocator, cudaMallocAsync
# and cudaMalloc (the code of ../shared/tools/torch_replay.py), each trace's two sides back to
# back (paired.py, which also times PyTorch pass by pass with torch_streams.py's code, on the
# trace's own streams or its one), in three rounds; then the pair (one
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
#   (both are named cuda-<hash>; `.gpu/cuda_tests --list` ends in "19 tests, 0 benchmarks")
#   cp fixtures/user-bench/target/release/deps/threads-<hash> .gpu/threads_user
#   cp fixtures/user-bench/target/fp/release/deps/threads-<hash> .gpu/threads_fp
#   cp target/release/vramscope ../shared/tools/torch_replay.py ../shared/tools/torch_threads.py \
#     tests/gpu/run.sh tests/gpu/paired.py tests/gpu/table.py tests/gpu/torch_streams.py .gpu/
#   strip --strip-debug .gpu/cuda_tests .gpu/cuda_bench .gpu/vramscope .gpu/threads_*
# then with the `device` tool (carry [".gpu"]): bash .gpu/run.sh > $OUT/log.txt 2>&1, and
# python3 tests/gpu/table.py log.txt here. A part whose binary is missing is left out.
# Where one command would pass the device's 10 minutes, split it: PARTS names the parts to run
# (default all: tests traces pair threads; `traces` includes torch_streams.py) and SHARD=K/N
# replays only the K-th of N shares of the traces (every N-th, from the K-th in name order), e.g.
#   SHARD=1/2 PARTS="tests traces" bash .gpu/run.sh > $OUT/log1.txt 2>&1
#   SHARD=2/2 PARTS="traces pair threads" bash .gpu/run.sh > $OUT/log2.txt 2>&1
# and python3 tests/gpu/table.py log1.txt log2.txt reads them as one log.
# BENCHMARKS.md ("On the GPU") keeps the latest table with the GPU's name.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
PARTS=" ${PARTS:-tests traces pair threads} "
part() { case $PARTS in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
SHARD=${SHARD:-1/1}
# Swapped, the suite runs as ignored benchmarks and says nothing: say so.
if [ -x cuda_tests ] && ! ./cuda_tests --list 2>/dev/null | grep -q ': test$'; then
  echo "== cuda_tests lists no tests: is it the pair bench? (see the packing notes at the top)"
fi
# The suite's results, and the tests that returned early without exercising what they test (a
# loan where the block was not lent, views with `cuMemAlloc` segments): the harness counts
# those as passes, so they are counted here apart, each with its reason.
cuda_suite() {
  out=$(timeout 120 ./cuda_tests --nocapture 2>&1)
  echo "$out" | grep -E "^test |test result|panicked" | head -30
  echo "skipped, passed without exercising their behaviour: $(echo "$out" | grep -c "skipped:")"
  echo "$out" | grep -o "skipped: .*" | sort | uniq -c
}
for seg in malloc virtual default; do
  part tests && [ -x cuda_tests ] || break
  echo "== cuda tests, $seg segments"
  if [ $seg = default ]; then
    (unset VRAMSCOPE_CUDA_SEGMENTS; cuda_suite)
  else
    VRAMSCOPE_CUDA_SEGMENTS=$seg cuda_suite
  fi
done
# TRACES=DIR (relative to this script's folder) replays the traces there instead of the fixtures'.
i=0; k=${SHARD%/*}; n=${SHARD#*/}
rm -rf traces && mkdir -p traces && for f in "${TRACES:-../fixtures/torch}"/*.trace.json*; do  # gzipped in the tree
  i=$((i + 1)); [ $(( (i - k) % n )) = 0 ] || continue
  case $f in *.gz) gunzip -c "$f" > "traces/$(basename "$f" .gz)" ;; *) cp "$f" traces/ ;; esac
done
if part traces; then
echo "== traces: share $SHARD, $(ls traces | wc -l) traces"
# Rounds (ROUNDS, default 3), each trace's replays through vramscope and PyTorch back to back
# (paired.py): the host's speed changes from one minute to the next (up to 2x, BENCHMARKS.md),
# so table.py compares each round's pair, seconds apart, and takes the median of the rounds'
# ratios. vramscope's warm passes: at least 5, and about 300,000 operations in all (some tens
# of milliseconds), so that one replay spans more than a moment of the host's speed.
timeout 1800 python3 paired.py traces "${ROUNDS:-3}" 2>&1 | grep -v Warning
# The traces on several streams go through PyTorch and the pool on those streams too, in
# paired.py's rounds (torch_streams.py's code, read from that file): their peaks, and their
# time paired with vramscope's. Before, torch_streams.py also ran here, three times
# after paired.py, for peaks that paired.py's rounds now give.
fi
if part pair && [ -x cuda_bench ]; then
  echo "== pair bench"; timeout 200 ./cuda_bench --bench 2>&1 | grep -v "^$"
fi
for i in 1 2; do for b in user fp; do
  part threads && [ -x threads_$b ] || continue
  echo "== threads $b $i"; timeout 200 ./threads_$b --backend cuda --secs 0.5 --recording off 2>&1
  timeout 200 ./threads_$b --backend cuda --secs 0.5 --recording default 2>&1
done; done
if part threads && [ -f torch_threads.py ]; then echo "== torch_threads.py"; timeout 300 python3 torch_threads.py 2>&1 | grep -v Warning; fi
