#!/usr/bin/env bash
# On the device machine: records workloads of fixtures/torch/workloads.py into .gpu/DIR
# (gzipped copies under $OUT/DIR), then replays them with run.sh (the CUDA suite first where
# .gpu/cuda_tests is staged; PARTS, if set, passed on), in one command.
#   bash .gpu/heldout.sh [DIR NAME...]
# Without arguments: the `HELDOUT` workloads into .gpu/held (249 s on an H200);
# winter.sh calls it for the `WINTER` ones. Stage .gpu as run.sh's top says (cuda_tests,
# vramscope, torch_replay.py, paired.py, table.py, torch_streams.py, run.sh), copy this script
# there, and run `bash .gpu/heldout.sh > $OUT/log.txt`.
set -u
cd "$(dirname "$0")/.."
dir=${1:-held}
[ $# -gt 0 ] && shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(ppo_rollouts distill_teacher_student pointnet_varpoints fno_varres vae_epochs
  ensemble_streams)
mkdir -p ".gpu/$dir"
t0=$(date +%s)
timeout 240 env OUT=".gpu/$dir" python3 fixtures/torch/workloads.py "${names[@]}" 2>&1 | grep -v Warning
echo "recorded in $(( $(date +%s) - t0 )) s"
mkdir -p "$OUT/$dir" && for f in ".gpu/$dir"/*.trace.json; do gzip -9 -n -c "$f" > "$OUT/$dir/$(basename "$f").gz"; done
TRACES=$dir ROUNDS=3 timeout $(( 585 - ($(date +%s) - t0) )) bash .gpu/run.sh
echo "total $(( $(date +%s) - t0 )) s"
