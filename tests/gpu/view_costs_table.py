#!/usr/bin/env python3
"""Prints the table of a `tests/gpu/aliasing.sh builds` log: per trace, the first pass's ns/op and
milliseconds of build A, build B and PyTorch's expandable segments, peak reserved over peak
live of A and B, and the warm passes' driver calls; then geometric means and sums.

    python3 tests/gpu/view_costs_table.py LOG
"""
import json
import math
import sys


def main(path):
    runs, torch, key = {}, {}, None
    for line in open(path):
        if line.startswith("== replay "):
            key = tuple(line.split()[2:4])
        elif line.startswith('{"trace"') and key:
            runs[key] = json.loads(line)
            key = None
        elif line.startswith('{"trace"') and "torch_cold_ns_op" in line:
            d = json.loads(line)
            torch[d["trace"].replace(".trace.json", "")] = d
    names = sorted({k[0] for k in runs})
    print("| trace | A cold ns/op (ms) | B cold ns/op (ms) | expandable cold ns/op (ms) | A peak | B peak | A, B warm calls |")
    print("|---|---|---|---|---|---|---|")
    logs = {"A": [], "B": [], "T": []}
    total = {"A": 0.0, "B": 0.0, "T": 0.0}
    for n in names:
        a, b, t = runs.get((n, "A")), runs.get((n, "B")), torch.get(n)
        if not (a and b and t):
            continue
        ms = lambda ns, ops: ns * ops / 1e6
        for k, ns, ops in (("A", a["cold_ns_per_op"], a["ops"]), ("B", b["cold_ns_per_op"], b["ops"]),
                           ("T", t["torch_cold_ns_op"], t["ops"])):
            logs[k].append(math.log(ns))
            total[k] += ms(ns, ops)
        print(f"| {n} | {a['cold_ns_per_op']:.0f} ({ms(a['cold_ns_per_op'], a['ops']):.0f}) "
              f"| {b['cold_ns_per_op']:.0f} ({ms(b['cold_ns_per_op'], b['ops']):.0f}) "
              f"| {t['torch_cold_ns_op']:.0f} ({ms(t['torch_cold_ns_op'], t['ops']):.0f}) "
              f"| {a['fragmentation']:.4f} | {b['fragmentation']:.4f} "
              f"| {a['warm_device_calls']}, {b['warm_device_calls']} |")
    gm = {k: math.exp(sum(v) / len(v)) for k, v in logs.items() if v}
    print(f"\n{len(logs['A'])} traces; geometric mean of the first pass's ns/op: A {gm['A']:.0f}, "
          f"B {gm['B']:.0f}, PyTorch's expandable segments {gm['T']:.0f}; "
          f"first passes in all: A {total['A']:.0f} ms, B {total['B']:.0f} ms, expandable {total['T']:.0f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
