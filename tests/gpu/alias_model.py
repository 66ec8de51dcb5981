#!/usr/bin/env python3
"""A model, not vramscope: one growing address range as the default (virtual) segments keep it,
with and without *aliasing on growth*, to see what mapping a physical page at a second address
would buy (BENCHMARKS.md, "A trace no fixed layout fits").

The range: every request (rounded to 512 bytes) by best fit over its holes, the free end (the
free block at the top of what is mapped) taken last, only where no hole fits, and grown by the
whole 2 MiB pages it lacks; memory is never given back, so the peak is the mapped size. Streams
are ignored (every trace as if on one), as is the fragmentation limit.

Aliasing on growth: a request above 1 MiB that no hole fits and that would grow the range takes
instead n wholly free pages (n: the pages its size spans) of the range, wherever they lie,
seen through a *view*, an address range that maps those pages in order, where that maps fewer
new pages than growing would (only the pages free pages lack); otherwise the range grows as
before. The view's pages are taken out of the range's holes for as long as its block lives.
Views are kept when their block is freed; a later request of n pages first looks for a kept
view of n pages whose pages are all free again, and maps a new one (a driver call) only where
none is. Peak reserved is still the range's mapped size: a view maps no memory of its own.
Why it settles: a pass that repeats the last one's requests and starts from the same memory (the
last grew nothing) finds, at each request, the same holes as before and the view made for it
then, so it maps nothing; a pass that grew the range starts the next from more memory, whose
holes may differ. On the fixtures that took at most two warm passes.

Each trace is replayed `PASSES` times (7: a cold pass and six warm ones), everything still live
freed at the end of a pass as `vramscope replay` does. Prints, per trace, peak reserved over
peak live and each pass's driver calls (growths and views mapped), without and with aliasing;
with `--targets FILE` (JSON: trace file name to the better of PyTorch's and the pool's peak
over live), the rows above their target and a summary.

    python3 tests/gpu/alias_model.py [--targets tests/gpu/targets-47.json] TRACE...
"""
import bisect
import gzip
import json
import math
import os
import sys

from fit_model import carve, give_back

PAGE = 2 << 20
LARGE = 1 << 20
PASSES = int(os.environ.get("PASSES", 7))


def load(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        events = json.load(f)["events"]
    return [(e[0], e[1], max(512, -(-e[2] // 512) * 512)) for e in events]


def pages_in(n):
    return -(-n // PAGE)


class Range:
    def __init__(self, alias):
        self.free = []  # (start, size) sorted by address, merged
        self.mapped = 0
        self.alias = alias
        self.views = {}  # pages -> list of page tuples
        self.calls = 0
        self.view_pages = 0

    def free_end(self):
        return len(self.free) - 1 if self.free and sum(self.free[-1]) == self.mapped else None

    def grow(self, pages):
        e = self.free_end()
        if e is None:
            self.free.append((self.mapped, pages * PAGE))
        else:
            self.free[e] = (self.free[e][0], self.free[e][1] + pages * PAGE)
        self.mapped += pages * PAGE
        self.calls += 1

    def page_free(self, p):
        i = bisect.bisect(self.free, (p * PAGE, math.inf)) - 1
        return i >= 0 and self.free[i][0] <= p * PAGE and sum(self.free[i]) >= (p + 1) * PAGE

    def take_page(self, p):
        i = bisect.bisect(self.free, (p * PAGE, math.inf)) - 1
        start, size = self.free.pop(i)
        if p * PAGE > start:
            self.free.insert(i, (start, p * PAGE - start))
            i += 1
        if start + size > (p + 1) * PAGE:
            self.free.insert(i, ((p + 1) * PAGE, start + size - (p + 1) * PAGE))

    def free_pages(self):
        return [p for start, size in self.free for p in range(pages_in(start), (start + size) // PAGE)]

    def alloc(self, size):
        end = self.free_end()
        best = None
        for i, (_, have) in enumerate(self.free):
            if i != end and have >= size and (best is None or have < self.free[best][1]):
                best = i
        if best is not None:
            return ("range", carve(self.free, best, size, False), size)
        have = self.free[end][1] if end is not None else 0
        if have >= size:
            return ("range", carve(self.free, end, size, False), size)
        lacks = pages_in(size - have)
        if self.alias and size > LARGE:
            n = pages_in(size)
            for view in self.views.get(n, []):
                if all(self.page_free(p) for p in view):
                    for p in view:
                        self.take_page(p)
                    return ("view", view, size)
            free = self.free_pages()
            if max(0, n - len(free)) < lacks:
                if len(free) < n:
                    self.grow(n - len(free))
                    free = self.free_pages()
                view = tuple(free[:n])
                self.views.setdefault(n, []).append(view)
                self.view_pages += n
                self.calls += 1
                for p in view:
                    self.take_page(p)
                return ("view", view, size)
        self.grow(lacks)
        return ("range", carve(self.free, self.free_end(), size, False), size)

    def release(self, block):
        kind, where, size = block
        if kind == "range":
            give_back(self.free, where, size)
        else:
            for p in where:
                give_back(self.free, p * PAGE, PAGE)


def replay(events, alias):
    """(peak reserved over peak live, each pass's driver calls, views, pages the views map)."""
    r, live, now, peak, calls = Range(alias), {}, 0, 0, []
    for _ in range(PASSES):
        before = r.calls
        for op, key, size in events:
            if op == "a":
                live[key] = r.alloc(size)
                now += size
                peak = max(peak, now)
            elif key in live:
                block = live.pop(key)
                now -= block[2]
                r.release(block)
        for block in live.values():
            now -= block[2]
            r.release(block)
        live.clear()
        calls.append(r.calls - before)
    return r.mapped / peak, calls, sum(len(v) for v in r.views.values()), r.view_pages


def main(args):
    targets = {}
    if args[:1] == ["--targets"]:
        targets = json.load(open(args[1]))
        args = args[2:]
    tally = {False: [0, 0, 0.0], True: [0, 0, 0.0]}  # above target, late, sum of logs
    rows = 0
    for path in args:
        name = os.path.basename(path)
        events = load(path)
        target = targets.get(name)
        cells = []
        for alias in (False, True):
            ratio, calls, views, mapped = replay(events, alias)
            above = target is not None and ratio > target + 1e-9
            cells.append(f"{ratio:.3f}{'*' if above else ''} {calls}" + (f" views {views} ({mapped} pages)" if alias else ""))
            if target is not None:
                tally[alias][0] += above
                tally[alias][1] += sum(calls[3:]) > 0
                tally[alias][2] += math.log(ratio)
        rows += target is not None
        shown = f"{target:.4f}" if target is not None else "-"
        print(f"{name.split('.')[0]:26} target {shown:<6} range {cells[0]} | aliasing {cells[1]}", flush=True)
    if rows:
        for alias in (False, True):
            above, late, logs = tally[alias]
            print(f"{'aliasing' if alias else 'range   '}: {rows} rows with a target, {above} above it, {late} calling after the "
                  f"second warm pass, geometric mean {math.exp(logs / rows):.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
