#!/usr/bin/env bash
# On the device machine: records the `DECEMBER` workloads of fixtures/torch/workloads.py,
# replays them through PyTorch's caching allocator and the cudaMallocAsync pool
# (torch_replay.py), then through vramscope on CUDA with virtual and with `cuMemAlloc`
# segments, 4 warm passes, recording off (73 s on an H200; that run also replayed
# each with an experimental build's rule, BENCHMARKS.md, "Nine workloads nobody had seen, and a
# rule judged on them"). Gzipped traces land in $OUT/dec. Pack, here:
#   cargo build --release --features cuda -p vramscope-cli
#   mkdir -p .gpu/dec && cp target/release/vramscope fixtures/torch/workloads.py \
#     ../shared/tools/torch_replay.py tests/gpu/december.sh tests/gpu/replay_cuda.sh .gpu/dec/ \
#     && strip --strip-debug .gpu/dec/vramscope
# then with the `device` tool (carry [".gpu/dec"]): bash .gpu/dec/december.sh > $OUT/dec.log 2>&1
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p traces
t0=$(date +%s)
timeout 330 env OUT=traces python3 workloads.py wavenet_varlen multicrop_ssl detr_varres dqn_replay_growing \
  nerf_rays unet3d_crops causal_lm_sft ctc_speech_varlen seq2seq_greedy_serving 2>&1 | grep -v Warning
echo "recorded in $(( $(date +%s) - t0 )) s"
mkdir -p "$OUT/dec" && for f in traces/*.trace.json; do gzip -9 -n -c "$f" > "$OUT/dec/$(basename "$f").gz"; done
timeout 150 python3 torch_replay.py traces 2>&1 | grep -v Warning
bash replay_cuda.sh traces
echo "total $(( $(date +%s) - t0 )) s"
