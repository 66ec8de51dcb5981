#!/usr/bin/env bash
# On the device machine: the CUDA suite 60 times under its parallel runner (two with the default
# virtual segments for each with `cuMemAlloc` ones), with replays of the traces on several
# streams between the first rounds (as before the two failures of
# `a_block_used_on_another_stream_waits_for_that_work`). The
# replays also give the cost of `share_idle_streams` (one `cuStreamQuery` at each free of a
# lent block) in the project's build (frame pointers on) and in a user's (`vramscope_nofp`,
# built with RUSTFLAGS=""): 20 warm passes, each trace with the switch on and off.
# Pack, here:
#   cargo build --release --features cuda -p vramscope-cli
#   RUSTFLAGS="" CARGO_TARGET_DIR=target/nofp cargo build --release --features cuda -p vramscope-cli
#   cargo test --release --features cuda --test cuda --no-run      # prints the test binary
#   mkdir -p .gpu/multi && cp tests/gpu/sync_streams.sh .gpu/
#   cp target/release/vramscope .gpu/; cp target/nofp/release/vramscope .gpu/vramscope_nofp
#   cp target/release/deps/cuda-<hash> .gpu/cuda_tests
#   strip --strip-debug .gpu/vramscope .gpu/vramscope_nofp .gpu/cuda_tests
#   for t in ema_side_stream grad_buckets_streams pipeline_streams prefetch_side_stream; do
#     cp fixtures/torch/$t.trace.json.gz .gpu/multi/; done
# then with the `device` tool (carry [".gpu"]): bash .gpu/sync_streams.sh > $OUT/log.txt 2>&1
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$SECONDS
for r in $(seq 1 20); do
  for seg in virtual malloc virtual; do
    VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./cuda_tests > /tmp/o.txt 2>&1
    rc=$?
    echo "suite $r $seg rc=$rc $(grep -m1 'test result' /tmp/o.txt)"
    [ $rc = 0 ] || grep -A8 panicked /tmp/o.txt | cut -c1-700 | head -16
  done
  if [ "$r" -le 3 ]; then
    for f in multi/*; do for bin in vramscope vramscope_nofp; do for share in true false; do
      for seg in virtual malloc; do
        out=$(VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./$bin replay "$f" --backend cuda --warm 20 \
          --record off --json --config share_idle_streams:$share 2>&1 | tail -1)
        echo "replay $r $(basename "$f") $bin share=$share $seg $out" | cut -c1-900
      done
    done; done; done
  fi
  [ $((SECONDS - start)) -gt 500 ] && { echo "stopped at round $r: time"; break; }
done
echo "done in $((SECONDS - start)) s"
