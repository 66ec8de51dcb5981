#!/usr/bin/env bash
# On the device machine: the CUDA tests (both kinds of segments), the side-by-side replay
# (vramscope vs PyTorch, cudaMallocAsync, cudaMalloc) and the cached-pair benchmark (vramscope vs
# cudarc's stream.alloc). Everything it prints is the record BENCHMARKS.md quotes.
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for seg in malloc virtual; do
  echo "== cuda tests, $seg segments"
  VRAMSCOPE_CUDA_SEGMENTS=$seg ./cuda_tests --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|OOM after|reserved|reused after|panicked|skipped" | head -30
done
for seg in malloc virtual; do
  echo "== vramscope replay (cuda, $seg segments), default configuration"
  for f in resnet_train leaky_train; do for i in 1 2 3; do
    VRAMSCOPE_CUDA_SEGMENTS=$seg ./vramscope replay $f.trace.json --backend cuda --warm 5 --json; echo
  done; done
done
echo "== vramscope replay (cuda), fragmentation_limit:off (PyTorch-like)"
for f in resnet_train leaky_train; do ./vramscope replay $f.trace.json --backend cuda --warm 5 --config fragmentation_limit:off --json; echo; done
echo "== cached pairs: vramscope vs cudarc stream.alloc (divan, ns per pair)"
for i in 1 2 3; do ./cuda_bench --bench 2>&1 | grep -v "^$"; done
echo "== torch_replay.py"
python3 torch_replay.py . 2>&1 | grep -v Warning | tail -14
