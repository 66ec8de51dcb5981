#!/usr/bin/env python3
"""Prints the tables of a `tests/gpu/run.sh` log. The traces: every trace by allocator, warm
ns/op, driver calls after the second warm pass, peak reserved over peak live; vramscope's rows
are `malloc`/`virtual` (segment kind) x `off`/`fast` (recording off, default recording), one
run a round; PyTorch and the cudaMallocAsync pool are torch_replay.py's, one run a round (one
stream: compare multi-stream traces on peak and calls, not time), and for traces on several
streams torch_streams.py's too (PyTorch and the pool on the trace's own streams), whose peaks
are then the ones the target compares with, and whose time too where paired.py replayed them
in each round ("own streams: " and the rounds' ratios; "own streams, unpaired" in older logs,
medians of separate commands). Then the allocator's targets per trace and segment
kind (no driver call after the second warm pass, the peak, both times), on medians of the
rounds (the host's speed changes between runs). The pair: one cached allocation and free,
ns (divan medians of `benches/cuda.rs`; PyTorch's from torch_threads.py at one thread). The
threads: million pairs per second in all at 1 to 16 threads, each run's figure, and the most
threads' total over one thread's.

    python3 tests/gpu/table.py LOG...   # several logs (run.sh's SHARD and PARTS) read as one
"""
import json
import re
import sys


def divan_medians(lines):
    """(bench, arg) -> median in ns, from divan's tree output."""
    out, bench = {}, None
    unit = {"ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9}
    for line in lines:
        m = re.match(r"^([│ ]*)[├╰]─ (\S+)\s*(.*)$", line)
        if not m:
            continue
        depth, name, rest = len(m.group(1)) // 3, m.group(2), m.group(3)
        cols = [c.strip() for c in rest.split("│")]
        if depth == 0:
            bench = name
        if len(cols) >= 3 and cols[2]:
            v = cols[2].split()
            out[(bench, name if depth else "")] = float(v[0]) * unit.get(v[1], 1)
    return out


def tenth(xs):
    """The fastest tenth's bound of per-pass times: the host's fast phase."""
    return sorted(xs)[len(xs) // 10]


def fastest_tenth(rs, sides):
    """Where both sides give every warm pass's time in every round (vramscope's replay, and
    torch_streams.py): the median over rounds of the ratio of their fastest
    tenth's bound, else None. The device host runs a process at two speeds about 2x apart in
    phases of seconds (BENCHMARKS.md, "The host's two speeds are phases"); the fastest tenth of
    hundreds of passes is each side in the fast phase, where a median mixes them. Shown beside
    the medians, which the targets are judged on."""
    if len(rs) != len(sides) or not all(
            "torch_warm_ns_op_passes" in t and r.get("warm_ns_per_op") for r, t in zip(rs, sides)):
        return None
    return median([tenth(r["warm_ns_per_op"]) / tenth(t["torch_warm_ns_op_passes"]) for r, t in zip(rs, sides)])


def warm_segments(per_pass):
    """PyTorch's segments reserved in each warm pass on a trace's streams: the first four, and
    the sum of the rest where paired.py ran as many passes as vramscope's (hundreds)."""
    shown = "/".join(map(str, per_pass[:4]))
    rest = per_pass[4:]
    return shown + (f" (+{sum(rest)} in {len(rest)} more)" if rest else "")


def pair_table(pairs, threads, torch_threads):
    if not pairs and not threads:
        return
    print("\n| pair (ns) | 512 B | 1 MiB | 64 MiB |")
    print("|---|---|---|---|")
    for bench, label in (("vramscope_pair", "vramscope, recording off"),
                         ("vramscope_pair_recording", "vramscope, default recording"),
                         ("cudarc_stream_alloc_pair", "cudarc `stream.alloc` (driver's pool)")):
        row = [pairs.get((bench, a)) for a in ("512", "1048576", "67108864")]
        if any(row):
            print(f"| {label} | " + " | ".join(f"{v:.0f}" if v else "" for v in row) + " |")
    one = [r for r in torch_threads if r["threads"] == 1 and r["own_stream"]]
    if one:
        print("| PyTorch's allocator (512 B, one thread) | " + ", ".join(f"{1e9 / r['pairs_per_s']:.0f}" for r in one) + " | | |")


def thread_table(threads, torch_threads):
    if not threads and not torch_threads:
        return
    counts = sorted({r["threads"] for r in threads + torch_threads})
    print("\n| pairs per second (M, each run) | " + " | ".join(str(c) for c in counts) + " | least / one |")
    print("|---|" + "---|" * (len(counts) + 1))
    rows = {}
    for r in threads:
        key = (f"vramscope, {r['build']} build, recording {r['recording']}", r["own_stream"])
        rows.setdefault(key, {}).setdefault(r["threads"], []).append(r["pairs_per_s"])
    for r in torch_threads:
        rows.setdefault(("PyTorch's allocator (no recording)", r["own_stream"]), {}).setdefault(r["threads"], []).append(r["pairs_per_s"])
    for (label, own), by in rows.items():
        cells = [", ".join(f"{v / 1e6:.2f}" for v in by.get(c, [])) for c in counts]
        # The allocator's target: at every thread count at least 0.9 times the one-thread figure.
        # The least ratio over the counts, the slower run at N against the faster at one.
        ratio = ""
        more = [c for c in counts[1:] if by.get(c)]
        if by.get(counts[0]) and more:
            ratio = f"{min(min(by[c]) for c in more) / max(by[counts[0]]):.2f}"
        print(f"| {label}, {'own streams' if own else 'one stream'} | " + " | ".join(cells) + f" | {ratio} |")


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def late_calls(r):
    """A replay's driver calls after its second warm pass (the allocator's settling target), or None
    in a log that kept only the last pass's."""
    return sum(r["warm_device_calls"][2:]) if "warm_device_calls" in r else None


def targets(names, runs, torch, same, paired):
    """The allocator's targets per trace and segment kind: no driver call after the second warm pass;
    peak reserved at most the better of PyTorch's and the pool's (exactly for the default
    kind, virtual; within 1% for the other); warm ns/op recording off at most half of
    PyTorch's and default recording at most PyTorch's (single-stream traces: torch_replay.py
    replays every trace on one stream). Time: in a paired log (paired.py: each trace's two
    sides seconds apart), the median over rounds of each round's ratio, vramscope's ns/op over
    PyTorch's; otherwise the medians of the rounds, each side's own."""
    if paired:
        print("\n| trace | segments | no call after 2 warm passes | peak / better of PyTorch and pool | off: ns/op over PyTorch's, median of rounds (at most 0.5) | default: the same (at most 1) |")
    else:
        print("\n| trace | segments | no call after 2 warm passes | peak / better of PyTorch and pool | off: median / half PyTorch's | default: median / PyTorch's |")
    print("|---|---|---|---|---|---|")
    met, tenth_met = {}, {}
    for name in names:
        ts = torch.get(name, [])
        for seg in ("virtual", "malloc"):
            off, fast = runs.get((name, seg, "off"), []), runs.get((name, seg, "fast"), [])
            if not off or not ts:
                continue
            cells, ok = [], []
            # No driver call after at most two warm passes (before, this
            # read only the last warm pass, which passed `nerf_rays` with `cuMemAlloc` segments
            # calling in its third and fourth). Logs without every pass's calls: the last's.
            calls = all((late_calls(r) if late_calls(r) is not None
                         else r["warm_device_allocs"] + r["warm_device_maps"]) == 0 for r in off + fast)
            cells.append("yes" if calls else "**no**")
            ok.append(calls)
            best = min(min(t["torch_peak_reserved"], t["async_peak_reserved"]) for t in ts)
            if off[0].get("streams", 1) > 1 and same.get(name):
                # Like for like: PyTorch and the pool on the trace's own streams.
                best = min(min(t["torch_peak_reserved"], t.get("pool_peak_reserved", t["torch_peak_reserved"]))
                           for t in same[name])
            peak = max(r["peak_reserved_bytes"] for r in off + fast)
            slack = 1.0 if seg == "virtual" else 1.01
            good = peak <= best * slack
            cells.append(f"{peak / best:.3f}" + ("" if good else " **missed**"))
            ok.append(good)
            several = off[0].get("streams", 1) > 1
            # A paired log's PyTorch side of each round: torch_replay.py's on one stream, or for
            # a trace on several streams torch_streams.py's on them, run by paired.py in the
            # same round as vramscope's replays, seconds apart.
            # torch_streams.py's passes, in paired.py's rounds: on a trace's own streams, and
            # on one stream too, for the fastest tenth.
            by_pass = sorted((t for t in same.get(name, []) if "paired_round" in t), key=lambda t: t["paired_round"])
            sides = by_pass if several else ts
            if paired and len(off) == len(fast) == len(sides):
                label = "own streams: " if several else ""
                for rs, bound in ((off, 0.5), (fast, 1.0)):
                    ratios = [r["ns_per_op"] / t["torch_warm_ns_op"] for r, t in zip(rs, sides)]
                    m = median(ratios)
                    good = m <= bound
                    t10 = fastest_tenth(rs, by_pass)
                    if t10 is not None:
                        tenth_met.setdefault((seg, bound), []).append(t10 <= bound)
                    cells.append(f"{m:.2f} ({label}{', '.join(f'{x:.2f}' for x in ratios)}"
                                 + ("" if t10 is None else f"; fastest tenth {t10:.2f}") + ")"
                                 + ("" if good else " **missed**"))
                    ok.append(good)
            elif several:
                # Like for like where torch_streams.py replayed the trace on its own streams
                # (its time is measured as torch_replay.py's is, but in a command of its own
                # after paired.py's: the medians of each side, not paired rounds).
                torch_ns = [t["torch_warm_ns_op"] for t in same.get(name, []) if "torch_warm_ns_op" in t]
                if not torch_ns:
                    cells += ["(streams: peak only)"] * 2
                for bound, rs in ((0.5, off), (1.0, fast)) if torch_ns else ():
                    m = median([r["ns_per_op"] for r in rs]) / median(torch_ns)
                    good = m <= bound
                    cells.append(f"{m:.2f} (own streams, unpaired)" + ("" if good else " **missed**"))
                    ok.append(good)
            else:
                torch_ns = median([t["torch_warm_ns_op"] for t in ts])
                for rs, bound in ((off, torch_ns / 2), (fast, torch_ns)):
                    m = median([r["ns_per_op"] for r in rs])
                    good = m <= bound
                    cells.append(f"{m:.0f} / {bound:.0f}" + ("" if good else " **missed**"))
                    ok.append(good)
            met.setdefault(seg, []).append(all(ok))
            print(f"| {name} | {seg} | " + " | ".join(cells) + " |")
    for seg, oks in met.items():
        print(f"\n{seg} segments: every target met on {sum(oks)} of {len(oks)} traces")
        for bound, what in ((0.5, "recording off"), (1.0, "default recording")):
            t = tenth_met.get((seg, bound), [])
            if t:
                print(f"{seg} segments, {what}: time at most {bound} of PyTorch's by the fastest tenth of "
                      f"passes on {sum(t)} of {len(t)} traces")


def main(paths):
    runs, torch, same = {}, {}, {}
    key = None
    section, pair_lines, threads, torch_threads = None, [], [], []
    paired = False
    for line in (line for path in paths for line in open(path)):
        line = line.rstrip("\n")
        if line.startswith("== "):
            section = line[3:]
            key = None  # a replay that printed no JSON leaves nothing for the next section's line
            paired = paired or section == "paired"
        if section == "pair bench":
            pair_lines.append(line)
        line = line.strip()
        if section and section.startswith("threads ") and line.startswith('{"backend":"vramscope-'):
            r = json.loads(line)
            if "own_stream" in r:
                r["build"] = "user" if section.split()[1] == "user" else "frame-pointer"
                threads.append(r)
        if line.startswith('{"backend": "torch"') or line.startswith('{"backend":"torch"'):
            torch_threads.append(json.loads(line))
        if line.startswith("== replay "):
            key = tuple(line.split()[2:5])
        elif line.startswith('{"trace"') and key:
            runs.setdefault(key, []).append(json.loads(line))
            key = None
        elif line.startswith('{"trace":') or line.startswith('{"trace": '):
            d = json.loads(line)
            name = d["trace"].replace(".gz", "").replace(".trace.json", "")
            if "sum_of_stream_peaks" in d:
                # torch_streams.py: the same streams as the trace.
                same.setdefault(name, []).append(d)
            elif "torch_warm_ns_op" in d:
                torch.setdefault(name, []).append(d)
    names = sorted({k[0] for k in runs})
    print("| trace | allocator | warm ns/op | driver calls after 2 warm passes | peak reserved / peak live |")
    print("|---|---|---|---|---|")
    for name in names:
        for seg in ("malloc", "virtual"):
            for rec in ("off", "fast"):
                rs = runs.get((name, seg, rec), [])
                if not rs:
                    continue
                ns = ", ".join(f"{r['ns_per_op']:.0f}" for r in rs)
                # Logs without every pass's calls: the last pass's segments+maps.
                calls = ", ".join(str(late_calls(r)) if late_calls(r) is not None
                                  else f"{r['warm_device_allocs']}+{r['warm_device_maps']} (last pass)" for r in rs)
                frag = ", ".join(f"{r['fragmentation']:.3f}" for r in rs)
                label = f"vramscope, {'cuMemAlloc' if seg == 'malloc' else 'virtual'} segments, recording {rec}"
                print(f"| {name} | {label} | {ns} | {calls} | {frag} |")
        ts = torch.get(name, [])
        if ts:
            live = ts[0]["peak_live"]
            row = lambda k: ", ".join(f"{t[k]:.0f}" for t in ts)
            peak = lambda k: ", ".join(sorted({f"{t[k] / live:.3f}" for t in ts}))
            print(f"| {name} | PyTorch | {row('torch_warm_ns_op')} | | {peak('torch_peak_reserved')} |")
            print(f"| {name} | cudaMallocAsync | {row('async_warm_ns_op')} | | {peak('async_peak_reserved')} |")
            print(f"| {name} | cudaMalloc | {row('cudaMalloc_ns_op_first20k')} (first 20k) | every op | 1 |")
        ss = [t for t in same.get(name, []) if t.get("streams", 2) > 1]
        if ss:
            live = ss[0]["peak_live"]
            calls = ", ".join(warm_segments(t["torch_segments_per_pass"][1:]) for t in ss)
            peak = lambda k: ", ".join(sorted({f"{t[k] / live:.3f}" for t in ss if k in t}))
            print(f"| {name} | PyTorch, the trace's streams | | {calls} (segments) | {peak('torch_peak_reserved')} |")
            print(f"| {name} | cudaMallocAsync, the trace's streams | | | {peak('pool_peak_reserved')} |")
    targets(names, runs, torch, same, paired)
    pair_table(divan_medians(pair_lines), threads, torch_threads)
    thread_table(threads, torch_threads)


if __name__ == "__main__":
    main(sys.argv[1:])
