#!/usr/bin/env bash
# On the device machine: one `vramscope` binary (built as users build it, with the cuda
# feature) replays four fixture traces on the CUDA backend and on the sim backend, each segment
# kind, three rounds: sim_vs_cuda.sh with these traces, each replay 140,000 to 680,000
# operations (run.sh's: about 300,000), the median and fastest of its warm passes after the
# second. The sim calls no driver, so what moves it between rounds is the host alone
# (up to 2.3 times from one round to the next on an H200 host; log
# docs/lab/runs/h200-host-speed.txt, written before this script called
# sim_vs_cuda.sh: the same figures, without the fastest). Pack, here:
#   RUSTFLAGS= CARGO_TARGET_DIR=target/user cargo build --release --features cuda -p vramscope-cli
#   mkdir -p .gpu && cp target/user/release/vramscope tests/gpu/host_speed.sh tests/gpu/sim_vs_cuda.sh .gpu/
# then with the `device` tool (carry [".gpu"]): bash .gpu/host_speed.sh > $OUT/probe.txt 2>&1
set -u
cd "$(dirname "$0")"
lscpu | grep -E "Model name|MHz|L2|L3" | head -5
TRACES="gru_tbptt:60 staggered_buffers:3000 tts_autoregressive:5 gpt2_train:20" SKIP=2 exec bash sim_vs_cuda.sh
