#!/usr/bin/env python3
"""Prints the table of a `tests/gpu/run.sh` log: every trace by allocator, warm ns/op, driver
calls in the last warm pass, peak reserved over peak live. vramscope's rows are
`malloc`/`virtual` (segment kind) x `off`/`fast` (recording off, default recording), two runs
each; PyTorch and the cudaMallocAsync pool are torch_replay.py's (one stream: compare
multi-stream traces on peak and calls, not time).

    python3 tests/gpu/table.py LOG
"""
import json
import sys


def main(path):
    runs, torch = {}, {}
    key = None
    for line in open(path):
        line = line.strip()
        if line.startswith("== replay "):
            key = tuple(line.split()[2:5])
        elif line.startswith('{"trace"') and key:
            runs.setdefault(key, []).append(json.loads(line))
            key = None
        elif line.startswith('{"trace":') or line.startswith('{"trace": '):
            d = json.loads(line)
            if "torch_warm_ns_op" in d:
                torch[d["trace"].replace(".trace.json", "")] = d
    names = sorted({k[0] for k in runs})
    print("| trace | allocator | warm ns/op | warm driver calls | peak reserved / peak live |")
    print("|---|---|---|---|---|")
    for name in names:
        for seg in ("malloc", "virtual"):
            for rec in ("off", "fast"):
                rs = runs.get((name, seg, rec), [])
                if not rs:
                    continue
                ns = ", ".join(f"{r['ns_per_op']:.0f}" for r in rs)
                calls = ", ".join(f"{r['warm_device_allocs']}+{r['warm_device_maps']}" for r in rs)
                frag = ", ".join(f"{r['fragmentation']:.3f}" for r in rs)
                label = f"vramscope, {'cuMemAlloc' if seg == 'malloc' else 'virtual'} segments, recording {rec}"
                print(f"| {name} | {label} | {ns} | {calls} | {frag} |")
        t = torch.get(name)
        if t:
            live = t["peak_live"]
            print(f"| {name} | PyTorch | {t['torch_warm_ns_op']:.0f} | | {t['torch_peak_reserved'] / live:.3f} |")
            print(f"| {name} | cudaMallocAsync | {t['async_warm_ns_op']:.0f} | | {t['async_peak_reserved'] / live:.3f} |")
            print(f"| {name} | cudaMalloc | {t['cudaMalloc_ns_op_first20k']:.0f} (first 20k) | every op | 1 |")


if __name__ == "__main__":
    main(sys.argv[1])
