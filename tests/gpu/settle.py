#!/usr/bin/env python3
"""Replays traces on the sim deciding as on CUDA (`vramscope replay --backend sim-cuda`), with
both segment kinds (`release_pages:true`: virtual, `false`: `cuMemAlloc`), and prints how they
settle: rows, backend calls for memory in all warm passes, those in warm passes 3 and later
("late"), rows with a late call, the last warm pass with a call, and the geometric mean of peak
reserved over peak live; then the same per segment kind and one stream or several. With V=1 in
the environment, one line per row too. Runs two replays at a time.

    python3 tests/gpu/settle.py target/release/vramscope WARM TRACE... [-- CONFIG...]
    e.g. OUT=/tmp/gen python3 tests/gpu/random_streams.py 1000 1240 &&
         python3 tests/gpu/settle.py target/release/vramscope 10 /tmp/gen/t*.trace.json
"""
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

binary, warm, traces = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
extra = []
if "--" in traces:
    i = traces.index("--")
    traces, extra = traces[:i], traces[i + 1:]


def replay(job):
    trace, pages = job
    config = ",".join([f"release_pages:{pages}"] + extra)
    out = subprocess.run([binary, "replay", trace, "--backend", "sim-cuda", "--warm", str(warm),
                          "--config", config, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{trace}: {out.stderr.strip()}")
    return trace, pages, json.loads(out.stdout)


with ThreadPoolExecutor(2) as pool:
    rows = list(pool.map(replay, [(t, p) for t in traces for p in ("true", "false")]))


def totals(rows):
    """Rows, warm calls, late calls, rows with a late call, last warm pass with a call, and
    the geometric mean of peak over live, of `rows`."""
    calls = late = late_rows = last = 0
    log_peak = 0.0
    for _, _, r in rows:
        c = r["warm_device_calls"]
        calls += sum(c)
        late += sum(c[2:])
        late_rows += int(sum(c[2:]) > 0)
        last = max([last] + [k + 1 for k, v in enumerate(c) if v])
        log_peak += math.log(r["fragmentation"])
    return len(rows), calls, late, late_rows, last, math.exp(log_peak / max(len(rows), 1))


if os.environ.get("V"):
    for trace, pages, r in rows:
        print(f"{os.path.basename(trace)} release_pages:{pages} streams {r['streams']} "
              f"peak {r['fragmentation']:.3f} calls {r['warm_device_calls']}")
n, calls, late, late_rows, last, peak = totals(rows)
print(f"rows {n} warm_calls {calls} late {late} rows_late {late_rows} last_pass {last} peak {peak:.4f}")
# The same per segment kind and one stream or several: the rules differ between them.
groups = {}
for row in rows:
    _, pages, r = row
    kind = ("virtual" if pages == "true" else "cuMemAlloc", "one stream" if r["streams"] == 1 else "several")
    groups.setdefault(kind, []).append(row)
for (seg, streams), group in sorted(groups.items()):
    n, calls, late, late_rows, _, peak = totals(group)
    print(f"  {seg}, {streams}: rows {n} warm_calls {calls} late {late} rows_late {late_rows} peak {peak:.4f}")
