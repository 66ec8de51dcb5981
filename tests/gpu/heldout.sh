#!/usr/bin/env bash
# On the device machine: records the `HELDOUT` workloads of fixtures/torch/workloads.py into
# .gpu/held (gzipped copies under $OUT/held), then replays them with run.sh (the CUDA suite
# first where .gpu/cuda_tests is staged), in one command (2026-11-28: 249 s on an H200). Stage
# .gpu as run.sh's top says (cuda_tests, vramscope, torch_replay.py, paired.py, table.py,
# torch_streams.py, run.sh), copy this script there, and run `bash .gpu/heldout.sh > $OUT/log.txt`.
set -u
cd "$(dirname "$0")/.."
mkdir -p .gpu/held
t0=$(date +%s)
timeout 240 env OUT=.gpu/held python3 fixtures/torch/workloads.py ppo_rollouts distill_teacher_student \
  pointnet_varpoints fno_varres vae_epochs ensemble_streams 2>&1 | grep -v Warning
echo "recorded in $(( $(date +%s) - t0 )) s"
mkdir -p "$OUT/held" && for f in .gpu/held/*.trace.json; do gzip -9 -n -c "$f" > "$OUT/held/$(basename "$f").gz"; done
TRACES=held ROUNDS=3 timeout $(( 585 - ($(date +%s) - t0) )) bash .gpu/run.sh
echo "total $(( $(date +%s) - t0 )) s"
