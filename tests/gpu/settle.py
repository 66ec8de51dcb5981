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
calls = late = late_rows = last = 0
log_peak = 0.0
for trace, pages, r in rows:
    c = r["warm_device_calls"]
    calls += sum(c)
    late += sum(c[2:])
    late_rows += int(sum(c[2:]) > 0)
    last = max([last] + [k + 1 for k, v in enumerate(c) if v])
    log_peak += math.log(r["fragmentation"])
    if os.environ.get("V"):
        print(f"{os.path.basename(trace)} release_pages:{pages} streams {r['streams']} "
              f"peak {r['fragmentation']:.3f} calls {c}")
print(f"rows {len(rows)} warm_calls {calls} late {late} rows_late {late_rows} last_pass {last} "
      f"peak {math.exp(log_peak / max(len(rows), 1)):.4f}")
# The same per segment kind and one stream or several: the rules differ between them.
groups = {}
for trace, pages, r in rows:
    kind = ("virtual" if pages == "true" else "cuMemAlloc", "one stream" if r["streams"] == 1 else "several")
    g = groups.setdefault(kind, [0, 0, 0, 0, 0.0])
    c = r["warm_device_calls"]
    g[0] += 1
    g[1] += sum(c)
    g[2] += sum(c[2:])
    g[3] += int(sum(c[2:]) > 0)
    g[4] += math.log(r["fragmentation"])
for (seg, streams), (n, c, lt, lr, lp) in sorted(groups.items()):
    print(f"  {seg}, {streams}: rows {n} warm_calls {c} late {lt} rows_late {lr} peak {math.exp(lp / n):.4f}")
