#!/usr/bin/env python3
"""Reads the two logs of tests/gpu/aliasing.sh (vramscope's replays, then torch_replay.py's) and
prints, per trace: the better of PyTorch's and the pool's peak reserved over peak live (the
target, measured in the same session), vramscope's with virtual segments without and with views
(`*`: above the target), its warm driver calls per pass, and warm ns/op (the median of the warm
passes after the first) beside PyTorch's; then a summary for each configuration. torch_replay.py
replays every trace on one stream: a trace on several streams is marked `~` instead of `*` where
above that target, and counted apart (run.sh judges those against PyTorch and the pool on the
trace's own streams, torch_streams.py).

    python3 tests/gpu/aliasing_table.py AL_LOG TORCH_LOG
"""
import json
import math
import statistics
import sys


def json_lines(path):
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            yield json.loads(line)


def main(al_log, torch_log):
    torch = {j["trace"].split(".")[0]: j for j in json_lines(torch_log) if "trace" in j}
    ours, name, conf = {}, None, None
    for line in open(al_log):
        if line.startswith("== replay "):
            _, _, name, _, conf = line.split()
            name = name.split(".")[0]
        elif line.startswith("{") and name:
            ours[(name, conf)] = json.loads(line)
    confs = ["alias_pages:false", "alias_pages:true"]
    # above, late, sum of logs, rows, slower than half, above a one-stream target on several streams
    tally = {c: [0, 0, 0.0, 0, 0, 0] for c in confs}
    print(f"{'trace':24} {'target':>7} | {'views off: peak, calls, ns/op':34} | {'views on':34} | torch ns/op")
    for name in sorted(torch):
        t = torch[name]
        target = min(t["torch_peak_reserved"], t["async_peak_reserved"]) / t["peak_live"]
        cells = []
        for c in confs:
            r = ours.get((name, c))
            if r is None:
                cells.append("missing")
                continue
            ratio = r["peak_reserved_bytes"] / r["peak_live_bytes"]
            over = ratio > target * (1 + 1e-9)
            above = over and r["streams"] == 1
            ns = statistics.median(r["warm_ns_per_op"][1:])
            tally[c][0] += above
            tally[c][5] += over and not above
            tally[c][1] += sum(r["warm_device_calls"][2:]) > 0
            tally[c][2] += math.log(ratio / target)
            tally[c][3] += 1
            tally[c][4] += r["streams"] == 1 and ns > t["torch_warm_ns_op"] / 2
            mark = "*" if above else "~" if over else " "
            cells.append(f"{ratio:.4f}{mark} {r['warm_device_calls']} {ns:6.0f}")
        streams = ours.get((name, confs[0]), {}).get("streams", 1)
        print(f"{name:24} {target:7.4f} | {cells[0]:34} | {cells[1]:34} | {t['torch_warm_ns_op']:6.0f}"
              + (f" ({streams} streams)" if streams > 1 else ""))
    for c, (above, late, logs, rows, slow, apart) in tally.items():
        print(f"{c}: {rows} traces, {above} above the target ({apart} more on several streams, above a "
              f"one-stream target), {late} calling after the second warm pass, "
              f"geometric mean over the target {math.exp(logs / rows):.4f}, "
              f"{slow} one-stream traces over half PyTorch's warm ns/op")


if __name__ == "__main__":
    main(*sys.argv[1:3])
