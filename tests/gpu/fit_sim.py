#!/usr/bin/env python3
"""The smallest memory each trace fits in with vramscope, on the sim deciding as on CUDA: for each
trace and segment kind, bisection on the most the allocator may reserve
(`per_process_memory_fraction` of a sim as large as the GPU, TOTAL bytes: what `--capacity`
does on CUDA; a cold pass and two warm ones) to 0.1% of the trace's peak live bytes, from its
live peak to what it reserves unconstrained. One JSON line per trace and kind: `fits`, the
smallest cap tried that ran, `fails`, the largest that ran out of memory. `fit.sh` checks both
on the GPU.

    TOTAL=150109880320 python3 tests/gpu/fit_sim.py target/release/vramscope \
      fixtures/torch/*.trace.json > fit-sim.jsonl     (TOTAL: the GPU's, from nvidia-smi or a log)
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

binary, traces = sys.argv[1], sys.argv[2:]
total = int(os.environ["TOTAL"])


def replay(trace, pages, cap):
    config = f"release_pages:{pages}" + (f",per_process_memory_fraction:{cap / total!r}" if cap < total else "")
    out = subprocess.run([binary, "replay", trace, "--backend", "sim-cuda", "--warm", "2", "--config", config,
                          "--capacity", str(total), "--json"], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else None


def search(job):
    trace, pages = job
    free = replay(trace, pages, total)
    live = free["peak_live_bytes"]
    lo, hi = live - 1, free["peak_reserved_bytes"] + (2 << 20)
    if replay(trace, pages, hi) is None:
        sys.exit(f"{trace}: no run at {hi} bytes")
    while hi - lo > max(live // 1000, 1 << 20):
        mid = (lo + hi) // 2
        if replay(trace, pages, mid):
            hi = mid
        else:
            lo = mid
    name = trace.split("/")[-1].removesuffix(".trace.json")
    return dict(trace=name, pages=pages == "true", live=live, fits=hi, fails=lo,
                unconstrained=free["peak_reserved_bytes"])


with ThreadPoolExecutor(2) as pool:
    for r in pool.map(search, [(t, p) for t in traces for p in ("false", "true")]):
        print(json.dumps(r), flush=True)
