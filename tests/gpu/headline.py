"""The headline table of BENCHMARKS.md, one row per fixture trace, from the logs of run.sh.

Runs table.py on the logs and condenses its two per-trace tables: peak reserved over peak live
for vramscope with each segment kind, PyTorch's caching allocator and the cudaMallocAsync pool
(first round); the median warm ns/op of vramscope (virtual segments, recording off) and of
PyTorch; and whether each segment kind met every target.

    python3 tests/gpu/headline.py LOG1 [LOG2 ...]
"""

import os
import statistics
import subprocess
import sys


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def main(logs):
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, os.path.join(here, "table.py"), *logs], check=True, capture_output=True, text=True
    ).stdout
    peaks, times, met = {}, {}, {}
    for line in out.splitlines():
        if not line.startswith("| ") or line.startswith("| trace") or line.startswith("|---"):
            continue
        c = cells(line)
        if len(c) == 5 and (c[1].startswith("vramscope") or c[1] in ("PyTorch", "cudaMallocAsync")):
            trace, who, ns, _calls, peak = c
            first_peak = peak.split(",")[0].strip()
            median_ns = statistics.median(int(x) for x in ns.split("(")[0].split(",") if x.strip())
            key = {
                "vramscope, virtual segments, recording off": "virtual",
                "vramscope, cuMemAlloc segments, recording off": "malloc",
                "PyTorch": "torch",
                "cudaMallocAsync": "pool",
            }.get(who)
            if key:
                peaks.setdefault(trace, {})[key] = first_peak
                times.setdefault(trace, {})[key] = median_ns
        elif len(c) == 6 and c[1] in ("virtual", "malloc"):
            met.setdefault(c[0], {})[c[1]] = "missed" not in line and "**no**" not in line
    print("| trace | peak / live: vramscope virtual, cuMemAlloc | PyTorch | pool "
          "| warm ns/op: vramscope, PyTorch | every target: virtual, cuMemAlloc |")
    print("|---|---|---|---|---|---|")
    for trace in sorted(peaks):
        p, t, m = peaks[trace], times.get(trace, {}), met.get(trace, {})
        yes = lambda k: "yes" if m.get(k) else "**no**"
        print(f"| {trace} | {p.get('virtual', '')}, {p.get('malloc', '')} | {p.get('torch', '')} "
              f"| {p.get('pool', '')} | {t.get('virtual', 0):.0f}, {t.get('torch', 0):.0f} "
              f"| {yes('virtual')}, {yes('malloc')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
