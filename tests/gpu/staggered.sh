#!/usr/bin/env bash
# On the device machine: records `staggered_buffers` (fixtures/torch/workloads.py, `BOUNDS`),
# writes four one-step versions of it (units of 64 MiB, 256 MiB and 1 GiB, and 250 MiB with
# block i 6 MiB x i smaller), replays them all through PyTorch's caching allocator and the
# cudaMallocAsync pool (torch_replay.py) and through vramscope on CUDA with each segment kind
# (4 warm passes, recording off), then maps one allocation at eight addresses (alias_pages.cpp).
# 45 s on an H200, log docs/lab/runs/h200-staggered.log
# (BENCHMARKS.md, "A trace no fixed layout fits"). Pack, here:
#   cargo build --release --features cuda -p vramscope-cli
#   mkdir -p .gpu/st && cp target/release/vramscope fixtures/torch/workloads.py \
#     ../shared/tools/torch_replay.py tests/gpu/staggered.sh tests/gpu/alias_pages.cpp \
#     tests/gpu/replay_cuda.sh .gpu/st/ && strip --strip-debug .gpu/st/vramscope
# then with the `device` tool (carry [".gpu/st"]): bash .gpu/st/staggered.sh > $OUT/st.log 2>&1
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p traces
python3 - <<'PY'
import json
blocks = [(1, 0, 6), (1, 2, 7), (1, 5, 8), (3, 0, 2), (2, 2, 5), (1, 5, 6), (2, 6, 7), (3, 7, 8)]
def make(name, unit, less=0):
    ev = []
    for t in range(9):
        for i, (s, a, b) in enumerate(blocks):
            if b == t:
                ev.append(["f", (i + 1) << 40, s * unit - less * i, 0])
        for i, (s, a, b) in enumerate(blocks):
            if a == t:
                ev.append(["a", (i + 1) << 40, s * unit - less * i, 0])
    with open(f"traces/{name}.trace.json", "w") as f:
        json.dump({"source": name, "torch": "synthetic", "events": ev}, f)
make("staggered_64m", 64 << 20); make("staggered_256m", 256 << 20); make("staggered_1g", 1 << 30)
make("staggered_odd", 250 << 20, less=12345 * 512)
PY
timeout 120 env OUT=traces python3 workloads.py staggered_buffers 2>&1 | grep -v Warning
mkdir -p "$OUT/st" && cp traces/*.json "$OUT/st/"
timeout 200 python3 torch_replay.py traces 2>&1 | grep -v Warning
bash replay_cuda.sh traces
/usr/local/cuda-13.0/bin/nvcc -o alias_pages alias_pages.cpp -lcuda 2>&1 | tail -3 && ./alias_pages
