#!/usr/bin/env bash
# On the device machine: records the `SNOW` workloads of fixtures/torch/workloads.py (six
# programs nobody here had seen, written before any was recorded) into .gpu/snow
# (gzipped copies under $OUT/snow), then runs the CUDA suite and replays them through the whole
# table with run.sh, in one command: heldout.sh with these names, as winter.sh does for `WINTER`
# (staging and reading as winter.sh says, with this script in place of it).
PARTS="tests traces" exec bash "$(dirname "$0")/heldout.sh" snow rnnt_joint continuous_batching_kv \
  optimizer_offload packed_documents growing_outputs swap_preempt_serving
