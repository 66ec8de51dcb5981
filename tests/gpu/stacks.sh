#!/usr/bin/env bash
# On the device machine: the cost of the default recording's stacks as users build,
# beside PyTorch's allocator, and the unwinder's property test. BENCHMARKS.md ("Stacks as users
# build") quotes what it prints. Packing, here (see tests/gpu/README.md):
#   (cd fixtures/user-bench && RUSTFLAGS= cargo bench --features cuda --bench threads --no-run &&
#    RUSTFLAGS="-C force-frame-pointers=yes" CARGO_TARGET_DIR=target/fp \
#      cargo bench --features cuda --bench threads --no-run)
#   cargo bench --bench alloc --no-run; cargo test --release --test unwind --no-run
#   RUSTFLAGS= CARGO_TARGET_DIR=target/nofp cargo test --release --test unwind --no-run
#   copy them to .gpu/ as threads_user, threads_fp, alloc_bench, unwind_fp, unwind_nofp
#   (strip --strip-debug keeps the unwind tables), with ../shared/tools/torch_threads.py and
#   this script; run `bash .gpu/stacks.sh` with carry [".gpu"].
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep "Model name"; nproc
echo "== unwind property test, release, frame pointers on, then off"
./unwind_fp --nocapture 2>&1 | grep -E "call trees|test result"
./unwind_nofp --nocapture 2>&1 | grep -E "call trees|test result"
echo "== project bench (frame pointers on): cached pair, sim backend"
./alloc_bench --bench cached_pair 2>&1 | grep -v "^$"
for i in 1 2; do for b in user fp; do
  echo "== user-bench, $b build, cuda backend, run $i"; ./threads_$b --backend cuda --secs 0.5
done; done
echo "== what an event costs on this host: rdtsc, a locked add, clock_gettime"
cat > /tmp/tsc.c <<'C'
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>
#include <stdatomic.h>
static double ns(struct timespec a, struct timespec b) { return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e7; }
int main(void) {
  struct timespec a, b, t; unsigned long long s = 0; _Atomic unsigned long x = 0;
  clock_gettime(CLOCK_MONOTONIC, &a); for (int i = 0; i < 10000000; i++) s += __rdtsc(); clock_gettime(CLOCK_MONOTONIC, &b);
  printf("rdtsc: %.1f ns\n", ns(a, b));
  clock_gettime(CLOCK_MONOTONIC, &a); for (int i = 0; i < 10000000; i++) atomic_fetch_add(&x, 1); clock_gettime(CLOCK_MONOTONIC, &b);
  printf("lock add: %.1f ns\n", ns(a, b));
  clock_gettime(CLOCK_MONOTONIC, &a); for (int i = 0; i < 10000000; i++) { clock_gettime(CLOCK_MONOTONIC, &t); s += t.tv_nsec; } clock_gettime(CLOCK_MONOTONIC, &b);
  printf("clock_gettime: %.1f ns (%llu)\n", ns(a, b), s & 1);
  return 0;
}
C
gcc -O2 -o /tmp/tsc /tmp/tsc.c && /tmp/tsc
echo "== torch_threads.py"; python3 torch_threads.py 2>&1 | grep -v Warning
