#!/usr/bin/env python3
"""Prints the table of a `tests/gpu/reclaim.sh` log: per trace and segment kind, the code before
and after (warm driver calls per pass, peak reserved over peak live, median warm ns/op), and
PyTorch's and the pool's peak and warm ns/op from torch_replay.py; then a summary per set
(fixtures, the random traces) and kind: rows calling the driver after two warm passes, warm
calls, geometric mean of the peaks, rows at or under the better of PyTorch's and the pool's
peak (within 1% for `cuMemAlloc` segments, as the target asks).

    python3 tests/gpu/reclaim_table.py LOG
"""
import json
import math
import sys

rows, torch = {}, {}
head = None
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("== replay "):
        head = tuple(line.split()[2:5])
    elif line.startswith("{") and head:
        rows[head] = json.loads(line)
        head = None
    elif line.startswith('{"trace"'):
        j = json.loads(line)
        torch[j["trace"].removesuffix(".trace.json")] = j
print("| trace | kind | calls before | calls after | peak before | after | PyTorch | pool | ns/op before | after | PyTorch |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
summary = {}
for (trace, kind, v) in sorted(rows):
    if v != "old":
        continue
    old, new = rows[(trace, kind, "old")], rows.get((trace, kind, "new"))
    if new is None:
        continue
    t = torch.get(trace, {})
    live = old["peak_live_bytes"]
    pt = t.get("torch_peak_reserved", 0) / live if t else float("nan")
    pool = t.get("async_peak_reserved", 0) / live if t else float("nan")
    print(f"| {trace} | {kind} | {old['warm_device_calls']} | {new['warm_device_calls']} | "
          f"{old['fragmentation']:.3f} | {new['fragmentation']:.3f} | {pt:.3f} | {pool:.3f} | "
          f"{old['ns_per_op']:.0f} | {new['ns_per_op']:.0f} | {t.get('torch_warm_ns_op', float('nan')):.0f} |")
    # Random traces by the thousand of their seed (each set generated apart).
    group = (f"seeds {trace[1]}xxx" if trace.startswith("t") and trace[1:].isdigit() else "fixtures", kind)
    s = summary.setdefault(group, {"n": 0, "old": [0, 0, 0.0, 0], "new": [0, 0, 0.0, 0]})
    s["n"] += 1
    best = min(pt, pool) * (1.01 if kind == "malloc" else 1.0)
    for v, r in (("old", old), ("new", new)):
        c = r["warm_device_calls"]
        s[v][0] += int(sum(c[2:]) > 0)
        s[v][1] += sum(c)
        s[v][2] += math.log(r["fragmentation"])
        s[v][3] += int(r["fragmentation"] <= best + 1e-9)
print("\n| set | kind | rows | calling after two warm passes: before, after | warm calls | peak (geomean) | peak met |")
print("|---|---|---|---|---|---|---|")
for (group, kind), s in sorted(summary.items()):
    o, n, k = s["old"], s["new"], s["n"]
    print(f"| {group} | {kind} | {k} | {o[0]}, {n[0]} | {o[1]}, {n[1]} | "
          f"{math.exp(o[2] / k):.4f}, {math.exp(n[2] / k):.4f} | {o[3]}, {n[3]} |")
