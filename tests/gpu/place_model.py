#!/usr/bin/env python3
"""Placement rules in a model of one growing address range that never gives memory back (as
`fit_model.py`), for "Lifetimes and the top of the range" (BENCHMARKS.md): each rule places
every request of a trace (rounded to 512 bytes) in a free hole or at the range's end, for four
passes; the peak is the range's high-water mark, rounded to 2 MiB, over the peak of live bytes.
Each trace's target is the better of PyTorch's and the pool's peak in the `torch_replay.py`
lines of the logs given; rows without one are skipped.

    python3 tests/gpu/place_model.py --logs LOG[,LOG...] RULE[,RULE...] TRACE...

Rules:
  best       best fit (the smallest hole that fits, the lowest of equal ones), at the hole's start
  first      first fit (the lowest hole that fits)
  life:K     a request whose size's last block lived fewer than K allocations is *short*: best
             fit, at the hole's high end; any other (long, or a size not seen freed yet): first
             fit, at the hole's start. Short blocks gather at holes' tops, long ones at the bottom
  life-best:K   as life:K, but long requests by best fit
  top:M      requests of at least M MiB in the highest hole that fits, at its high end; smaller
             ones by best fit
  older      best fit, the block against the hole's neighbour allocated earlier, so that the
             rest of the hole lies beside the younger one, which (freed first where lifetimes
             nest) merges it into a larger hole; a hole at the range's start counts its wall
             as the older
  fate       best fit, the block against the neighbour predicted to be freed later (allocated
             at clock t with a size whose last block lived L: freed at t + L; unknown: never)

Prints each trace's peak per rule, then per rule the geometric mean and the rows at most the
target, and the rows that the best rule per trace (an oracle no online allocator has) meets.
"""
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor

from fit_model import PAGE, carve, give_back, load


class Range:
    def __init__(self, rule):
        name, _, arg = rule.partition(":")
        self.name, self.arg = name, float(arg or 0)
        self.free = []  # (start, size), sorted by address; the free end is the last if any
        self.end = self.high = 0
        self.clock = 0
        self.born = {}  # start -> clock at allocation
        self.size_at = {}  # start -> size, of live blocks
        self.start_of_end = {}  # end -> start, of live blocks
        self.life = {}  # size -> lifetime of the last block of that size freed

    def alloc(self, size):
        self.clock += 1
        fits = [i for i, (st, sz) in enumerate(self.free) if sz >= size and st + sz != self.end]
        high = False
        pick = None
        if fits:
            best = min(fits, key=lambda i: (self.free[i][1], i))
            if self.name == "best":
                pick = best
            elif self.name == "first":
                pick = fits[0]
            elif self.name in ("life", "life-best"):
                last = self.life.get(size)
                short = last is not None and last < self.arg
                high = short
                pick = best if short or self.name == "life-best" else fits[0]
            elif self.name in ("older", "fate"):
                pick = best
                st, sz = self.free[pick]
                left, right = self.start_of_end.get(st), st + sz
                if self.name == "older":
                    # A missing left neighbour is the range's start: the oldest wall.
                    lb = self.born[left] if left is not None else -1
                    high = self.born[right] < lb
                else:
                    def freed_at(b):
                        if b is None:
                            return math.inf
                        return self.born[b] + self.life.get(self.size_at[b], math.inf)
                    high = freed_at(right) > freed_at(left)
            elif self.name == "top":
                if size >= self.arg * 2**20:
                    pick, high = fits[-1], True
                else:
                    pick = best
        if pick is None:
            if self.free and sum(self.free[-1]) == self.end:
                st, sz = self.free.pop()
                if sz > size:
                    self.free.append((st + size, sz - size))
                self.end = max(self.end, st + size)
                start = st
            else:
                start = self.end
                self.end += size
        else:
            start = carve(self.free, pick, size, high)
        self.high = max(self.high, self.end)
        self.born[start] = self.clock
        self.size_at[start] = size
        self.start_of_end[start + size] = start
        return start

    def release(self, start, size):
        self.life[size] = self.clock - self.born.pop(start)
        del self.size_at[start], self.start_of_end[start + size]
        give_back(self.free, start, size)


def peak(events, rule, passes=4):
    r = Range(rule)
    live, cur, top = {}, 0, 0
    for _ in range(passes):
        for op, key, size in events:
            if op == "a":
                if key in live:
                    continue
                live[key] = (r.alloc(size), size)
                cur += size
                top = max(top, cur)
            elif key in live:
                start, size = live.pop(key)
                cur -= size
                r.release(start, size)
        for key in list(live):
            start, size = live.pop(key)
            cur -= size
            r.release(start, size)
    return (r.high + PAGE - 1) // PAGE * PAGE / top


def name_of(path):
    return os.path.basename(path).split(".")[0]


def job(args):
    path, rules = args
    events = load(path)
    return name_of(path), [peak(events, rule) for rule in rules]


def main():
    if len(sys.argv) < 5 or sys.argv[1] != "--logs":
        sys.exit(__doc__)
    target = {}
    for log in sys.argv[2].split(","):
        for line in open(log):
            if line.startswith('{"trace": ') and '"async_peak_reserved"' in line:
                r = json.loads(line)
                t = min(r["async_peak_reserved"], r["torch_peak_reserved"]) / r["peak_live"]
                n = name_of(r["trace"])
                target[n] = min(target.get(n, t), t)
    rules = sys.argv[3].split(",")
    for rule in rules:
        name, _, arg = rule.partition(":")
        bare = ("best", "first", "older", "fate")
        if name not in bare + ("life", "life-best", "top") or (name in bare) != (arg == ""):
            sys.exit(f"{rule!r}: not a rule (best, first, older, fate, life:K, life-best:K, top:M)")
    traces = [p for p in sys.argv[4:] if name_of(p) in target]
    logs, met, oracle = [0.0] * len(rules), [0] * len(rules), 0
    with ProcessPoolExecutor(os.cpu_count()) as ex:
        for n, peaks in ex.map(job, [(p, rules) for p in traces]):
            t = target[n] + 5e-4
            print(f"{n:26} target {target[n]:.3f} " + " ".join(f"{r} {v:.3f}" for r, v in zip(rules, peaks)),
                  flush=True)
            for i, v in enumerate(peaks):
                logs[i] += math.log(v)
                met[i] += v <= t
            oracle += min(peaks) <= t
    rows = max(len(traces), 1)
    for i, r in enumerate(rules):
        print(f"{r}: geometric mean {math.exp(logs[i] / rows):.4f}, at most the target on {met[i]} of {len(traces)}")
    print(f"the best rule per trace: at most the target on {oracle} of {len(traces)}")


if __name__ == "__main__":
    main()
