#!/usr/bin/env bash
# CUDA tests and the side-by-side replay benchmark (vramscope vs PyTorch, cudaMallocAsync, cudaMalloc).
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== cuda tests"; ./cuda_tests --test-threads=1 2>&1 | grep -E "^test |test result|OOM after|reserved|panicked|skipped" | head -30
echo "== vramscope replay (cuda), default config"
for f in resnet_train leaky_train; do for i in 1 2 3; do ./vramscope replay $f.trace.json --backend cuda --json; done; done
echo "== vramscope replay (cuda), fragmentation_limit:off"
for f in resnet_train leaky_train; do ./vramscope replay $f.trace.json --backend cuda --config fragmentation_limit:off --json; done
echo "== vramscope pair (alternating alloc/free replay), ns per op = half a pair"
for b in 512 1048576 67108864; do ./vramscope replay pair_$b.json --backend cuda --warm 3 --json; done
echo "== torch_replay.py"
python3 torch_replay.py . 2>&1 | grep -v Warning | tail -12
