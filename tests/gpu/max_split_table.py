#!/usr/bin/env python3
"""The table of a max_split.sh log: per trace, peak reserved over peak live for vramscope with
each segment kind without and with the setting (warm driver calls after the first warm pass in
brackets where any), the earlier build with it where it ran, and PyTorch's caching allocator
without it, with it, and with it and expandable segments. Then the geometric means over the
traces every column has.

    python3 tests/gpu/max_split_table.py LOG
"""
import json
import math
import sys

rows, torch, head = {}, {}, None
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("== replay "):
        _, _, trace, binary, seg, conf = line.split(" ", 5)
        head = (trace, binary, seg, "default" if conf == "default" else "set")
    elif line.startswith("{") and head:
        r = json.loads(line)
        rows[head] = (r["peak_reserved_bytes"] / r["peak_live_bytes"], sum(r["warm_device_calls"][1:]))
        head = None
    elif line.startswith("{") and '"conf"' in line:
        r = json.loads(line)
        if "error" in r:
            continue
        kind = {"": "default"}.get(r["conf"], "exp+set" if "expandable" in r["conf"] else "set")
        torch[(r["trace"].removesuffix(".trace.json"), kind)] = r["torch_peak_reserved"] / r["peak_live"]

cols = [("vramscope cuMemAlloc", ("vramscope", "malloc", "default")),
        ("same, with the setting", ("vramscope", "malloc", "set")),
        ("vramscope virtual", ("vramscope", "virtual", "default")),
        ("same, with the setting", ("vramscope", "virtual", "set")),
        ("before, cuMemAlloc, with it", ("vramscope_before", "malloc", "set")),
        ("before, virtual, with it", ("vramscope_before", "virtual", "set")),
        ("PyTorch", "default"), ("PyTorch with it", "set"), ("PyTorch, expandable, with it", "exp+set")]
traces = sorted({k[0] for k in rows} | {k[0] for k in torch})
print("| trace | " + " | ".join(c for c, _ in cols) + " |")
print("|---" * (len(cols) + 1) + "|")
logs = {c: [] for c, _ in cols}


def cell(t, key):
    if isinstance(key, tuple):
        v = rows.get((t,) + key)
        return (None, "") if v is None else (v[0], f"{v[0]:.3f}" + (f" ({v[1]})" if v[1] else ""))
    v = torch.get((t, key))
    return (None, "") if v is None else (v, f"{v:.3f}")


for t in traces:
    cells = [cell(t, k) for _, k in cols]
    print(f"| {t} | " + " | ".join(s for _, s in cells) + " |")
full = [t for t in traces if all(cell(t, k)[0] for _, k in cols if k[0] != "vramscope_before")]
means = []
for name, k in cols:
    vals = [cell(t, k)[0] for t in full if cell(t, k)[0]]
    means.append(f"{math.exp(sum(map(math.log, vals)) / len(vals)):.3f}" if vals and len(vals) == len(full) else "")
print(f"| geometric mean ({len(full)} traces) | " + " | ".join(means) + " |")
