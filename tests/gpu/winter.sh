#!/usr/bin/env bash
# On the device machine: records the `WINTER` workloads of fixtures/torch/workloads.py (six
# programs nobody here had seen, written before any was recorded) into .gpu/winter (gzipped copies under
# $OUT/winter), then runs the CUDA suite and replays them through the whole table with run.sh
# (vramscope with each segment kind, recording off and default, PyTorch, the pool, cudaMalloc,
# three rounds; the multi-stream one also on its own streams), in one command: heldout.sh with
# these names. Stage .gpu as run.sh's top says (cuda_tests, vramscope built as users build it,
# torch_replay.py, paired.py, table.py, torch_streams.py, run.sh), copy this script and
# heldout.sh there, and with the `device` tool (carry [".gpu"]) run
# `bash .gpu/winter.sh > $OUT/log.txt 2>&1`; then, here, `python3 tests/gpu/table.py log.txt`.
PARTS="tests traces" exec bash "$(dirname "$0")/heldout.sh" winter moco_queue linear_attn_varlen \
  tts_autoregressive vae_decode_varres three_stream_serving train_eval_interleaved
