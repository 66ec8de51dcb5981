#!/usr/bin/env bash
# On the device machine: two builds of the CLI side by side on the seven fixture traces on
# several streams, interleaved in each round (ROUNDS, default 5), both segment kinds, recording
# off; prints per replay: round, trace, release_pages, build, ns/op, stream queries in the last
# warm pass, peak reserved, driver calls after the second warm pass. First the CUDA suite with
# each segment kind (SEGS= skips it). PIN="taskset -c 3" pins each replay to a core. Packing:
#   .gpu/vramscope_head: the older CLI (`git worktree add W REV`, then in W `RUSTFLAGS=
#     CARGO_TARGET_DIR=... cargo build --release --features cuda -p vramscope-cli`)
#   .gpu/vramscope: the newer, built the same way; .gpu/cuda_tests as run.sh's top says
#   strip --strip-debug .gpu/*; cp tests/gpu/queries_ab.sh .gpu/
# then (carry [".gpu"]) ROUNDS=5 bash .gpu/queries_ab.sh > $OUT/ab.txt 2>&1. Written for
# BENCHMARKS.md, "Asked only where a request takes a loan".
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for seg in ${SEGS-malloc virtual default}; do
  echo "== cuda tests, $seg segments"
  if [ $seg = default ]; then (unset VRAMSCOPE_CUDA_SEGMENTS; timeout 120 ./cuda_tests 2>&1 | grep -E "test result|panicked" | head -5)
  else VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 120 ./cuda_tests 2>&1 | grep -E "test result|panicked" | head -5; fi
done
mkdir -p abtraces
for t in ema_side_stream ensemble_streams fsdp_layer_gather grad_buckets_streams pipeline_streams prefetch_side_stream three_stream_serving; do
  gunzip -c ../fixtures/torch/$t.trace.json.gz > abtraces/$t.trace.json
done
for r in $(seq ${ROUNDS:-5}); do
  for f in abtraces/*.trace.json; do
    ops=$(python3 -c "import json;d=json.load(open('$f'));print(len(d['events']))" 2>/dev/null || echo 1000)
    for rp in true false; do
      for b in head new; do
        bin=./vramscope; [ $b = head ] && bin=./vramscope_head
        w=$(( 300000 / (ops > 0 ? ops : 1) )); [ $w -lt 5 ] && w=5; [ $w -gt 2000 ] && w=2000
        printf '%s %s %s %s ' "$r" "$(basename $f .trace.json)" "$rp" "$b"
        timeout 60 ${PIN:-} $bin replay $f --backend cuda --warm $w --config release_pages:$rp --json 2>&1 | python3 -c "
import json,sys
d=json.loads(sys.stdin.read()); print(round(d['ns_per_op'],1), d['warm_stream_queries'][-1], d['peak_reserved_bytes'], sum(d['warm_device_calls'][2:]))"
      done
    done
  done
done
