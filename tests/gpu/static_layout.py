#!/usr/bin/env python3
"""How little memory one pass of a trace needs when every block's address is chosen knowing
the whole pass in advance: an estimate of what an allocator that never calls the driver in a
warm pass (a fixed layout, no block moved) could reach, to tell a policy's misses that are
placement (a better layout exists) from those that need remapping in every pass (as the
`cudaMallocAsync` pool does).

Each request is rounded to 512 bytes and lives from its allocation to its free (blocks never
freed, to the end of the pass); blocks are placed one by one, in three orders (largest
first, largest size x lifetime first, longest lived first), each at the lowest address free
for its whole lifetime; the layout's size is its highest address, in 2 MiB pages, over the
peak of live bytes counted as placed (rounded to 512 bytes: within 0.05% of the trace's own
peak of live bytes on every fixture). These are heuristics (the optimum is NP-hard to find), so a figure is what a
layout *can* reach, not a bound below which none can go. Streams are ignored (a real layout
also has to wait for a block freed on another stream), so on several streams the figure is
optimistic. Quadratic in the blocks: 10,000 events take seconds, 150,000 about 20 minutes.

    python3 tests/gpu/static_layout.py fixtures/torch/gnn_random_graphs.trace.json.gz ...
"""
import gzip
import json
import sys

PAGE = 2 << 20


def lifetimes(path):
    """(start, end, size) of every block of one pass, and the pass's peak of live bytes."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["events"]
    live, blocks, now, peak = {}, [], 0, 0
    for t, (op, addr, size, *_) in enumerate(events):
        if op == "a":
            size = max(512, (size + 511) // 512 * 512)
            live[addr] = (t, size)
            now += size
            peak = max(peak, now)
        elif addr in live:
            start, size = live.pop(addr)
            now -= size
            blocks.append((start, t, size))
    blocks += [(start, len(events), size) for start, size in live.values()]
    return blocks, peak


def layout(blocks, key):
    """The highest address of the layout that places `blocks` in the order `key` gives."""
    placed, top = [], 0
    for start, end, size in sorted(blocks, key=key):
        taken = sorted((o, o + s) for (ps, pe, o, s) in placed if ps < end and start < pe)
        offset = 0
        for lo, hi in taken:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((start, end, offset, size))
        top = max(top, offset + size)
    return top


ORDERS = {
    "largest": lambda b: (-b[2], b[0]),
    "area": lambda b: (-(b[2] * (b[1] - b[0])), b[0]),
    "longest": lambda b: (-(b[1] - b[0]), -b[2]),
}

for path in sys.argv[1:]:
    blocks, peak = lifetimes(path)
    ratios = {name: layout(blocks, key) for name, key in ORDERS.items()}
    ratios = {name: (top + PAGE - 1) // PAGE * PAGE / peak for name, top in ratios.items()}
    best = min(ratios.values())
    name = path.split("/")[-1].split(".")[0]
    print(name, f"blocks {len(blocks)}", " ".join(f"{k} {v:.3f}" for k, v in ratios.items()),
          f"best {best:.3f}", flush=True)
