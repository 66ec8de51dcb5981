#!/usr/bin/env bash
# On the device machine: the CUDA suite 60 times under its parallel runner (three with virtual
# segments for each with `cuMemAlloc` ones), printing for each run the event queries that said
# "not ready" after their stream was synchronized (`an_idle_stream_has_done_its_work_whatever_its_events_say`):
# BENCHMARKS.md, "An event query that lags". Pack, here:
#   cargo test --release --features cuda --test cuda --no-run      # prints the test binary
#   mkdir -p .gpu && cp target/release/deps/cuda-<hash> .gpu/cuda_tests && strip --strip-debug .gpu/cuda_tests
#   cp tests/gpu/event_lag.sh .gpu/
# then with the `device` tool (carry [".gpu"]): bash .gpu/event_lag.sh > $OUT/log.txt 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$SECONDS
for r in $(seq 1 60); do
  seg=virtual; [ $((r % 4)) = 0 ] && seg=malloc
  VRAMSCOPE_CUDA_SEGMENTS=$seg timeout 60 ./cuda_tests --nocapture > /tmp/o.txt 2>&1
  rc=$?
  echo "suite $r $seg rc=$rc $(grep -m1 'test result' /tmp/o.txt) | $(grep -m1 'event queries that said' /tmp/o.txt)"
  [ $rc = 0 ] || grep -A8 panicked /tmp/o.txt | cut -c1-700 | head -16
  [ $((SECONDS - start)) -gt 330 ] && { echo "stopped at round $r: time"; break; }
done
echo "done in $((SECONDS - start)) s"
