"""PyTorch's own snapshot of expandable segments, recorded as PyTorch's docs show
(`_record_memory_history()` defaults), for `fixtures/torch/expandable_unmap.snapshot.pickle`:
one small tensor, then 60 MiB mapped, freed, 8 MiB taken back and `empty_cache()` (which unmaps
the free 40 MiB past the first 20). On the device machine:
    python3 tests/gpu/expandable_unmap.py $OUT
PyTorch's snapshot then lists the mapped ranges only (2 and 20 MiB), and PyTorch's viewer
(MemoryViz.js, "Allocator State History") fails on it at the first event, as on any trace on
the default stream whose unmapped pages must join a listed segment (tools/memoryviz/README.md)."""
import os, sys
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
import torch
out = sys.argv[1]
M = 1 << 20
torch.cuda.memory._record_memory_history()
small = torch.empty(1000, dtype=torch.uint8, device="cuda")
x = torch.empty(60 * M, dtype=torch.uint8, device="cuda")
del x
y = torch.empty(8 * M, dtype=torch.uint8, device="cuda")
torch.cuda.empty_cache()
torch.cuda.memory._dump_snapshot(f"{out}/expandable_unmap.snapshot.pickle")
snap = torch.cuda.memory._snapshot()
print("segments:", [(hex(g["address"]), g["total_size"] // M) for g in snap["segments"]])
print([(t["action"], hex(t["addr"]), t["size"], t["stream"]) for t in snap["device_traces"][0]])
