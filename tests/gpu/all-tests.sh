#!/usr/bin/env bash
# Every test binary built by `cargo test --release --features cuda --no-run`, three runs in a
# row with the harness defaults (parallel threads), on the device machine.
root=$PWD
echo "root $root"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "$root" != /work/main ]; then mkdir -p /work && { [ -e /work/main ] || ln -s "$root" /work/main; }; fi
ls -la /work/main | head -3
tar xJf .gpu/bins.tar.xz -C .gpu
mkdir -p target/release && cp .gpu/bin/vramscope-cli target/release/vramscope
cd /work/main
export INSTA_UPDATE=no RUST_BACKTRACE=0
for run in 1 2 3; do
  for b in .gpu/bin/*; do
    n=$(basename "$b"); [ "$n" = vramscope-cli ] && continue
    start=$(date +%s)
    "$b" > "$OUT/run$run-$n.log" 2>&1; rc=$?
    printf "run %s %-28s rc=%s %4ss %s\n" "$run" "$n" "$rc" "$(( $(date +%s) - start ))" "$(grep -m1 "^test result" "$OUT/run$run-$n.log")"
  done
done 2>&1 | tee "$OUT/summary.txt"
for run in 1 2; do
  VRAMSCOPE_CUDA_SEGMENTS=virtual .gpu/bin/cuda > "$OUT/virtual$run-cuda.log" 2>&1
  echo "virtual segments run $run: rc=$? $(grep -m1 '^test result' "$OUT/virtual$run-cuda.log")"
done 2>&1 | tee -a "$OUT/summary.txt"
# fixtures/beside-candle built with `--features candle` (see its Cargo.toml), when packed.
if [ -x .gpu/beside-candle ]; then
  LD_LIBRARY_PATH=/usr/local/cuda-13.0/lib64 .gpu/beside-candle > "$OUT/beside-candle.log" 2>&1
  echo "beside-candle: rc=$? $(tr '\n' ' ' < "$OUT/beside-candle.log")"
fi 2>&1 | tee -a "$OUT/summary.txt"
