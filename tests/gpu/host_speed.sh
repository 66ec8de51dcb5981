#!/usr/bin/env bash
# On the device machine: one `vramscope` binary (built as users build it, with the cuda
# feature) replays four fixture traces on the CUDA backend and on the sim backend, each segment
# kind, three rounds, printing the median of each replay's warm passes after the second:
# "ROUND TRACE BACKEND SEGMENTS NS_PER_OP". The sim calls no driver, so what moves it between
# rounds is the host alone (2026-12-02: up to 2.3 times from one round to the next on an H200
# host; log fixtures/torch/runs/2026-12-02-h200-host-speed.txt). sim_vs_cuda.sh is the same
# check on four other traces, 20 warm passes each; here each replay spans 140,000 to 680,000
# operations (run.sh: about 300,000). Pack, here:
#   RUSTFLAGS= CARGO_TARGET_DIR=target/user cargo build --release --features cuda -p vramscope-cli
#   mkdir -p .gpu/probe && cp target/user/release/vramscope .gpu/ && cp tests/gpu/host_speed.sh \
#     fixtures/torch/{gru_tbptt,staggered_buffers,tts_autoregressive,gpt2_train}.trace.json.gz .gpu/probe/
# then with the `device` tool (carry [".gpu"]): bash .gpu/probe/host_speed.sh > $OUT/probe.txt 2>&1
set -u
cd "$(dirname "$0")"
which perf valgrind 2>&1 | head -3
lscpu | grep -E "Model name|MHz|L2|L3" | head -5
V=../vramscope
for r in 1 2 3; do
for t in gru_tbptt staggered_buffers tts_autoregressive gpt2_train; do
  case $t in staggered_buffers) w=3000 ;; tts_autoregressive) w=5 ;; gpt2_train) w=20 ;; *) w=60 ;; esac
  for be in sim-cuda cuda; do
    for seg in virtual malloc; do
      if [ $be = sim-cuda ]; then
        rp=$([ $seg = virtual ] && echo true || echo false); c="--config release_pages:$rp"
      else
        c=""
      fi
      ns=$(VRAMSCOPE_CUDA_SEGMENTS=$seg $V replay $t.trace.json.gz --backend $be --warm $w --record off $c --json 2>&1 \
        | python3 -c "import sys,json; d=json.loads(sys.stdin.read().strip().split(chr(10))[-1]); w=sorted(d['warm_ns_per_op'][2:]); print(round(w[len(w)//2],1))")
      echo "$r $t $be $seg $ns"
    done
  done
done
done
