#!/usr/bin/env bash
# On the device machine: records the `ADVENT` workloads of fixtures/torch/workloads.py (six
# programs nobody here had seen, written before any was recorded) into .gpu/advent (gzipped copies under
# $OUT/advent), then runs the CUDA suite and replays them through the whole table with run.sh,
# in one command: heldout.sh with these names, as winter.sh does for `WINTER` (staging and
# reading as winter.sh says, with this script in place of it).
PARTS="tests traces" exec bash "$(dirname "$0")/heldout.sh" advent fsdp_layer_gather \
  quant_dequant_serving ssm_scan_varlen swin_window_varres lbfgs_fit chunked_vocab_loss
