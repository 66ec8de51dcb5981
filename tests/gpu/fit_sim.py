#!/usr/bin/env python3
"""The smallest memory each trace fits in with vramscope, on the sim deciding as on CUDA, as
large as the GPU (TOTAL bytes): `vramscope fit TRACE --device-memory TOTAL --json` per trace
(bisection on the most the allocator may reserve, `replay::smallest_cap`), one JSON line per
trace and segment kind for `fit.sh`: `fits`, the smallest cap tried that ran, `fails`, the
largest that ran out of memory. `fit.sh` checks both on the GPU.

    TOTAL=150109880320 python3 tests/gpu/fit_sim.py target/release/vramscope \\
      fixtures/torch/*.trace.json.gz > fit-sim.jsonl     (TOTAL: the GPU's, from nvidia-smi or a log)
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

binary, traces = sys.argv[1], sys.argv[2:]
total = os.environ["TOTAL"]


def fit(trace):
    out = subprocess.run([binary, "fit", trace, "--device-memory", total, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{trace}: {out.stderr.strip()}")
    return trace, json.loads(out.stdout)


with ThreadPoolExecutor(2) as pool:
    for trace, r in pool.map(fit, traces):
        name = trace.split("/")[-1].removesuffix(".gz").removesuffix(".trace.json")
        for kind, pages in (("cumemalloc", False), ("virtual", True)):
            f = r["segments"][kind]
            print(json.dumps(dict(trace=name, pages=pages, live=f["peak_live_bytes"], fits=f["fits"],
                                  fails=f["fails"], unconstrained=f["unconstrained_reserved_bytes"])), flush=True)
