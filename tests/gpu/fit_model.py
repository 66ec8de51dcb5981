#!/usr/bin/env python3
"""A model of one growing address range that never gives memory back, for "Why the pool's peak
is out of reach on some rows" (BENCHMARKS.md, "Unmapping what a request lacks"): each policy
places every request of a trace (rounded to 512 bytes) in a free range of one address space, or
at its end, for four passes, and the peak is the range's high-water mark (rounded to 2 MiB) over
the peak of live bytes: what an allocator that neither maps nor unmaps in its warm passes
reserves with that policy. With a `torch_replay.py` log, prints the pool's peak beside it.

    python3 tests/gpu/fit_model.py LOG TRACE...
    e.g. python3 tests/gpu/fit_model.py docs/lab/runs/h200-reclaim-2.log /tmp/gen/t2*.trace.json
"""
import bisect
import gzip
import json
import math
import os
import sys

SMALL = 1 << 20
PAGE = 2 << 20


def load(path):
    return [(e[0], e[1], (e[2] + 511) // 512 * 512) for e in json.load(gzip.open(path) if path.endswith(".gz") else open(path))["events"]]


def carve(free, pick, size, high):
    """Takes `size` bytes from the free range `free[pick]`, from its high end if `high`, else
    from its start, and returns where they start."""
    st, sz = free[pick]
    if sz == size:
        free.pop(pick)
        return st
    if high:
        free[pick] = (st, sz - size)
        return st + sz - size
    free[pick] = (st + size, sz - size)
    return st


def give_back(free, start, size):
    """Puts the range [start, start + size) back into `free` ((start, size) pairs sorted by
    address), merged with the free ranges it touches."""
    i = bisect.bisect(free, (start, 0))
    if i < len(free) and free[i][0] == start + size:
        size += free.pop(i)[1]
    if i > 0 and sum(free[i - 1]) == start:
        start, s = free.pop(i - 1)
        size += s
        i -= 1
    free.insert(i, (start, size))


class Range:
    def __init__(self):
        self.free = []  # (start, size), sorted by address
        self.end = 0
        self.high = 0

    def alloc(self, size, policy):
        pick = None
        for i, (_, sz) in enumerate(self.free):
            if sz < size:
                continue
            if policy == "first":
                pick = i
                break
            if pick is None or sz < self.free[pick][1]:
                pick = i
        if pick is None:
            if self.free and sum(self.free[-1]) == self.end:
                start, _ = self.free.pop()
            else:
                start = self.end
            self.end = start + size
        else:
            start = carve(self.free, pick, size, policy == "best-high" and size >= SMALL)
        self.high = max(self.high, self.end)
        return start

    def release(self, start, size):
        give_back(self.free, start, size)


def peak(events, policy, apart=False, passes=4):
    ranges = {"small": Range(), "large": Range()}
    live, cur, top = {}, 0, 0
    for _ in range(passes):
        for op, key, size in events:
            if op == "a":
                r = "small" if apart and size < SMALL else "large"
                live[key] = (r, ranges[r].alloc(size, policy), size)
                cur += size
                top = max(top, cur)
            else:
                r, start, size = live.pop(key)
                cur -= size
                ranges[r].release(start, size)
    return sum((r.high + PAGE - 1) // PAGE * PAGE for r in ranges.values()) / top


POLICIES = [("first", False), ("best", False), ("best-high", False), ("first", True), ("best", True)]


def main():
    log, traces = sys.argv[1], sys.argv[2:]
    pool = {}
    for line in open(log):
        if line.startswith('{"trace": ') and '"async_peak_reserved"' in line:
            # torch_replay.py's lines (a run.sh log holds vramscope's replays too).
            r = json.loads(line)
            pool[os.path.basename(r["trace"])] = r["async_peak_reserved"] / r["peak_live"]
    names = [f"{p}{' +small apart' if a else ''}" for p, a in POLICIES]
    logs = {n: 0.0 for n in names}
    met = {n: 0 for n in names}
    log_pool, rows = 0.0, 0
    for path in traces:
        name = os.path.basename(path)
        if name not in pool:
            continue
        events = load(path)
        peaks = [peak(events, p, a) for p, a in POLICIES]
        print(name, f"pool {pool[name]:.3f}", " ".join(f"{n} {v:.3f}" for n, v in zip(names, peaks)))
        rows += 1
        log_pool += math.log(pool[name])
        for n, v in zip(names, peaks):
            logs[n] += math.log(v)
            met[n] += v <= pool[name] + 5e-4
    print(f"{rows} rows; pool {math.exp(log_pool / max(rows, 1)):.4f}")
    for n in names:
        print(f"{n}: {math.exp(logs[n] / max(rows, 1)):.4f}, at most the pool's on {met[n]} rows")


if __name__ == "__main__":
    main()
