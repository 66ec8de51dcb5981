#!/usr/bin/env python3
"""A lower bound on the memory any fixed layout needs for a window of a trace, found by
exhaustive search: the least height into which the window's blocks can be placed, each at one
address for its whole lifetime, no two live at once overlapping. An allocator that makes no
driver call during a pass and maps each physical page at one address holds a fixed layout of
that pass, so its reserved bytes are at least this bound (blocks of the window only: leaving
blocks out never raises the least height, so a window's bound is a bound for the whole pass).

The search places blocks in order of address, each at address 0 or on top of a block placed
before it that is live at the same time (every layout can be pushed down into that form
without rising), and prunes a branch once it reaches the best height found. Exponential in the
blocks: meant for windows of a dozen blocks, as in `fixtures/torch/staggered_buffers`.

    python3 tests/gpu/staggered_bound.py TRACE [EVENTS]     # the first EVENTS events (16)
    python3 tests/gpu/staggered_bound.py --self-test
"""
import gzip
import json
import sys


def blocks_of(events):
    """(size, start, end) of every block allocated in `events`; live to the end if not freed."""
    live, out = {}, []
    for t, (op, addr, size, *_) in enumerate(events):
        if op == "a":
            live[addr] = (size, t)
        elif addr in live:
            size, start = live.pop(addr)
            out.append((size, start, t))
    out += [(size, start, len(events)) for size, start in live.values()]
    return out


def peak_live(blocks):
    """The most bytes live at once."""
    ends = sorted({b[1] for b in blocks})
    return max(sum(s for s, a, b in blocks if a <= t < b) for t in ends)


def least_height(blocks):
    """The least height of a fixed layout of `blocks`, by exhaustive search."""
    n = len(blocks)
    meets = [[j for j in range(n) if j != i and blocks[i][1] < blocks[j][2] and blocks[j][1] < blocks[i][2]]
             for i in range(n)]
    best = [sum(s for s, _, _ in blocks)]
    at = [None] * n

    def place(count, lowest, top):
        if top >= best[0]:
            return
        if count == n:
            best[0] = top
            return
        for i in range(n):
            if at[i] is not None:
                continue
            size = blocks[i][0]
            for c in sorted({0} | {at[j] + blocks[j][0] for j in meets[i] if at[j] is not None}):
                if c < lowest:
                    continue
                if any(at[j] is not None and c < at[j] + blocks[j][0] and at[j] < c + size for j in meets[i]):
                    continue
                at[i] = c
                place(count + 1, c, max(top, c + size))
                at[i] = None

    place(0, 0, 0)
    return best[0]


def self_test():
    # Two blocks live together fit side by side; three unit blocks at staggered times, each
    # alone with a filler of three units at some moment, do not fit in four.
    assert least_height([(1, 0, 2), (1, 1, 3)]) == 2
    assert least_height([(2, 0, 1), (1, 1, 2), (2, 2, 3)]) == 2
    staggered = [(1, 0, 6), (1, 2, 7), (1, 5, 8), (3, 0, 2), (2, 2, 5), (1, 5, 6), (2, 6, 7), (3, 7, 8)]
    assert peak_live(staggered) == 4 and least_height(staggered) == 5
    # Without its last filler the same blocks fit in four.
    assert least_height(staggered[:-1]) == 4
    print("self-test passed")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    path = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        events = json.load(f)["events"][:count]
    bl = blocks_of(events)
    live = peak_live(bl)
    height = least_height(bl)
    print(f"{path}: first {len(events)} events, {len(bl)} blocks: peak live {live} bytes, "
          f"least fixed layout {height} bytes ({height / live:.3f} times live)")
