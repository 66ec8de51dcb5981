#!/usr/bin/env bash
# On the device machine: the CUDA suite once with each segment kind, then every trace in
# multi/ (the traces on several streams) replayed through `vramscope replay --backend cuda`,
# 4 warm passes, with each kind: the figures of BENCHMARKS.md "Several streams in one range"
# (`cuMemAlloc` segments too), compared here with `vramscope replay --backend sim-cuda`.
# Pack, here:
#   cargo build --release --features cuda -p vramscope-cli
#   cargo test --release --features cuda --test cuda --no-run      # prints the test binary
#   mkdir -p .gpu/multi && cp target/release/vramscope tests/gpu/share_streams.sh .gpu/
#   cp target/release/deps/cuda-<hash> .gpu/cuda_tests
#   strip --strip-debug .gpu/vramscope .gpu/cuda_tests
#   for t in ema_side_stream grad_buckets_streams pipeline_streams prefetch_side_stream; do
#     cp fixtures/torch/$t.trace.json.gz .gpu/multi/; done   # and random_streams.py's, if any
# then with the `device` tool (carry [".gpu"]): bash .gpu/share_streams.sh > $OUT/log.txt 2>&1
cd "$(dirname "$0")"
for seg in malloc virtual; do
  VRAMSCOPE_CUDA_SEGMENTS=$seg ./cuda_tests > /tmp/o.txt 2>&1
  echo "cuda $seg rc=$? $(grep -m1 'test result' /tmp/o.txt)"
  grep -A3 panicked /tmp/o.txt | cut -c1-400 | head -4
done
for f in multi/*; do for p in false true; do
  echo "== $(basename "$f") $p"
  seg=$([ $p = true ] && echo virtual || echo malloc)
  VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./vramscope replay "$f" --backend cuda --warm 4 \
    --json 2>&1 | tail -1
done; done
