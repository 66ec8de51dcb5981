#!/usr/bin/env python3
"""The table of a fit.sh log: per trace, the smallest memory it fits in over its peak live bytes,
for vramscope with each segment kind (the sim's bisection, and whether the GPU ran at that
capacity and ran out of memory at the largest that failed on the sim) and for PyTorch's caching
allocator without and with expandable segments (bisection on the GPU); then the geometric means.

    python3 tests/gpu/fit_table.py LOG
"""
import json
import math
import sys

gpu, torch, head = {}, {}, None
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("== fit "):
        _, _, trace, seg, cap = line.split()
        head = (trace, seg, int(cap))
    elif line.startswith("{") and head:
        r = json.loads(line)
        gpu.setdefault(head[:2], []).append((head[2], "error" not in r, r))
        head = None
    elif line.startswith("{") and '"conf"' in line:
        r = json.loads(line)
        if "fits" in r:
            kind = "expandable" if "expandable" in r["conf"] else "native"
            torch[(r["trace"].removesuffix(".trace.json"), kind)] = (r["fits"] / r["peak_live"], r["peak_live"])

traces = sorted({t for t, _ in gpu} | {t for t, _ in torch})
cols = ["cuMemAlloc", "virtual"]
print("| trace | vramscope, cuMemAlloc segments | vramscope, virtual segments | PyTorch | PyTorch, expandable segments |")
print("|---|---|---|---|---|")
ratios = {c: [] for c in cols + ["native", "expandable"]}
checks = []
for t in traces:
    cells = []
    for seg, name in (("malloc", "cuMemAlloc"), ("virtual", "virtual")):
        runs = gpu.get((t, seg), [])
        if len(runs) != 2:
            cells.append("")
            continue
        (fits, ran, r), (fails, failed_ran, _) = runs
        live = r.get("peak_live_bytes") or torch.get((t, "native"), (0, 1))[1]
        ok = ran and not failed_ran
        checks.append(ok)
        ratios[name].append(fits / live)
        cells.append(f"{fits / live:.3f}" + ("" if ok else " (GPU differs)"))
    for kind in ("native", "expandable"):
        v = torch.get((t, kind))
        cells.append(f"{v[0]:.3f}" if v else "")
        if v:
            ratios[kind].append(v[0])
    print(f"| {t} | " + " | ".join(cells) + " |")
gm = [f"{math.exp(sum(map(math.log, v)) / len(v)):.3f}" if v else "" for v in ratios.values()]
print(f"| geometric mean | " + " | ".join(gm) + " |")
print(f"\nGPU as the sim said (ran at the sim's smallest capacity, out of memory at its largest failing one): "
      f"{sum(checks)} of {len(checks)}")
