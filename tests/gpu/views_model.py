#!/usr/bin/env python3
"""A model, not vramscope: how much memory an allocator would reserve, and how many driver calls
it would make in each pass, if it mapped physical pages at several addresses at once (CUDA
allows it: one `cuMemCreate` allocation mapped at eight addresses costs its size once,
`docs/lab/runs/h200-staggered.log`).

Physical memory is 2 MiB pages, each its own allocation (`cuMemMap` maps only whole
allocations). A request above 1 MiB takes as many pages as it spans, any of the free ones, seen
through a *view*: an address range mapping those pages in order. Views are kept when their
block is freed; a later request uses any run of consecutive pages of a kept view, the smallest
view first, where every page of the run is free; only where none has one is a view mapped (a
driver call), over the lowest-numbered free pages, and pages are created only where too few
are free. So physical memory is at most the peak of live pages: placement never strands a
page. Requests of at most 1 MiB are packed best-fit into 2 MiB small segments, never released,
as PyTorch's small pool. Streams are ignored (every trace replayed as if on one).

Each trace is replayed `PASSES` times (7: a cold pass and six warm ones), everything still live
freed at the end of a pass as `vramscope replay` does. Prints peak reserved over peak live and
the driver calls of each pass (views mapped, pages and small segments created).

    python3 tests/gpu/views_model.py fixtures/torch/ema_side_stream.trace.json.gz ...

Pure Python: the largest fixtures take minutes (`ppo_rollouts`, `seq2seq_greedy_serving`).
"""
import bisect
import gzip
import json
import os
import sys

PAGE = 2 << 20
SMALL = 1 << 20
PASSES = int(os.environ.get("PASSES", 7))


class SmallSegments:
    """Requests of at most 1 MiB, best fit over the free blocks of 2 MiB segments."""

    def __init__(self):
        self.free = []  # (size, segment, offset), sorted
        self.starts = {}  # (segment, offset) -> size of the free block there
        self.ends = {}  # (segment, end) -> (offset, size)
        self.segments = 0

    def _insert(self, seg, off, size):
        before = self.ends.pop((seg, off), None)
        if before is not None:
            off0, size0 = before
            self.free.remove((size0, seg, off0))
            del self.starts[(seg, off0)]
            off, size = off0, size0 + size
        after = self.starts.pop((seg, off + size), None)
        if after is not None:
            self.free.remove((after, seg, off + size))
            del self.ends[(seg, off + size + after)]
            size += after
        bisect.insort(self.free, (size, seg, off))
        self.starts[(seg, off)] = size
        self.ends[(seg, off + size)] = (off, size)

    def alloc(self, size):
        """The block for `size` bytes, and whether a segment was created for it."""
        created = False
        i = bisect.bisect_left(self.free, (size, -1, -1))
        if i == len(self.free):
            self._insert(self.segments, 0, PAGE)
            self.segments += 1
            created = True
            i = bisect.bisect_left(self.free, (size, -1, -1))
        have, seg, off = self.free.pop(i)
        del self.starts[(seg, off)]
        del self.ends[(seg, off + have)]
        if have > size:
            bisect.insort(self.free, (have - size, seg, off + size))
            self.starts[(seg, off + size)] = have - size
            self.ends[(seg, off + have)] = (off + size, have - size)
        return (seg, off, size), created

    def release(self, block):
        self._insert(*block)


def kept_run(views, busy, n):
    """A run of `n` free pages in a kept view of at least `n` pages, the smallest view first."""
    for m in sorted(k for k in views if k >= n):
        for view in views[m]:
            run = 0
            for i, page in enumerate(view):
                run = 0 if page in busy else run + 1
                if run == n:
                    return view[i - n + 1 : i + 1]
    return None


def replay(events):
    """(peak reserved over peak live, driver calls of each pass, views, pages mapped by views)."""
    small, views, busy, live = SmallSegments(), {}, set(), {}
    pages = live_bytes = peak_live = peak_reserved = 0
    calls = []
    for _ in range(PASSES):
        made = 0
        for op, addr, size, *_ in events:
            if op == "a":
                live_bytes += size
                peak_live = max(peak_live, live_bytes)
                if size <= SMALL:
                    block, created = small.alloc(max(512, -(-size // 512) * 512))
                    made += created
                    live[addr] = ("small", block, size)
                else:
                    n = -(-size // PAGE)
                    run = kept_run(views, busy, n)
                    if run is None:
                        free = sorted(set(range(pages)) - busy)
                        if len(free) < n:
                            free += range(pages, pages + n - len(free))
                            pages = free[-1] + 1
                            made += 1
                        run = tuple(free[:n])
                        views.setdefault(n, []).append(run)
                        made += 1
                    busy.update(run)
                    live[addr] = ("pages", run, size)
                peak_reserved = max(peak_reserved, (pages + small.segments) * PAGE)
            elif addr in live:
                kind, block, size = live.pop(addr)
                live_bytes -= size
                small.release(block) if kind == "small" else busy.difference_update(block)
        for kind, block, size in live.values():
            live_bytes -= size
            small.release(block) if kind == "small" else busy.difference_update(block)
        live.clear()
        calls.append(made)
    mapped = sum(len(v) for vs in views.values() for v in vs)
    return peak_reserved / peak_live, calls, sum(len(vs) for vs in views.values()), mapped


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            ratio, calls, nviews, mapped = replay(json.load(f)["events"])
        name = os.path.basename(path).split(".")[0]
        print(f"{name:26} {ratio:.3f}  calls, cold then warm: {calls}  views {nviews} ({mapped} pages)", flush=True)
