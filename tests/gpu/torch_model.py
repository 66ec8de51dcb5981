#!/usr/bin/env python3
"""A model of PyTorch's CUDA caching allocator with its default settings, written from its rules
(`c10/cuda/CUDACachingAllocator.cpp`, PyTorch 2.11), not from vramscope's code: what PyTorch
would reserve replaying a trace as `../shared/tools/torch_replay.py` does (a cold pass and
three warm ones, each pass's leftovers freed at its end), without a GPU.

    python3 tests/gpu/torch_model.py fixtures/torch/*.trace.json.gz   # one line per trace

The rules modelled: a request rounds up to a multiple of 512 bytes; requests of at most 1 MiB
come from the small pool, the rest from the large one; a request takes the smallest free block
of its pool that fits (ties: the lowest address); a block is split when what remains is at
least 512 bytes (small pool) or more than 1 MiB (large pool); a freed block merges with free
neighbours of its segment; with no block that fits, a new segment: 2 MiB for a small request,
20 MiB for one under 10 MiB, else the request rounded up to 2 MiB. Nothing is ever released
(PyTorch releases cached segments only when the device refuses one, and the H200 never did
here). One stream: a trace on several streams is modelled on one, as torch_replay.py replays it.

What it is for: ground truth for `vramscope replay --backend sim-cuda --config
fragmentation_limit:off,release_pages:false` (PyTorch's rules without the fragmentation limit)
and for what PyTorch's allocator reserves, computed apart from both. It equals PyTorch's peak
on the H200 to the byte on 63 of the 72 fixture traces; where it differs, likely the GPU's
addresses decided: PyTorch breaks ties between free blocks of one size by address, and the
driver chooses the addresses (BENCHMARKS.md, "The whole table, PyTorch pass by pass on every
trace").

Prints `name peak_reserved/peak_live peak_reserved peak_live`, peak live as torch_replay.py
counts it (the sum of the live requests' sizes).
"""
import bisect
import gzip
import json
import os
import sys

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(size):
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


def segment_size(size):
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class Block:
    __slots__ = ("addr", "size", "small", "prev", "next", "free")

    def __init__(self, addr, size, small, prev=None, nxt=None):
        self.addr, self.size, self.small, self.prev, self.next, self.free = addr, size, small, prev, nxt, True

    def key(self):
        return (self.size, self.addr)


class Model:
    def __init__(self):
        self.pools = {True: [], False: []}  # sorted (size, addr) keys of free blocks
        self.by_key = {}
        self.next_addr = 1 << 40
        self.reserved = self.peak = 0

    def index(self, b):
        bisect.insort(self.pools[b.small], b.key())
        self.by_key[(b.small,) + b.key()] = b

    def unindex(self, b):
        keys = self.pools[b.small]
        del keys[bisect.bisect_left(keys, b.key())]
        del self.by_key[(b.small,) + b.key()]

    def alloc(self, requested):
        size = round_size(requested)
        small = size <= SMALL_SIZE
        keys = self.pools[small]
        i = bisect.bisect_left(keys, (size, -1))
        if i < len(keys):
            b = self.by_key[(small,) + keys[i]]
            self.unindex(b)
        else:
            seg = segment_size(size)
            # Segments far apart: no two are ever neighbours.
            b = Block(self.next_addr, seg, small)
            self.next_addr += seg + (1 << 30)
            self.reserved += seg
            self.peak = max(self.peak, self.reserved)
        rest = b.size - size
        if (small and rest >= MIN_BLOCK) or (not small and rest > SMALL_SIZE):
            r = Block(b.addr + size, rest, small, b, b.next)
            if b.next:
                b.next.prev = r
            b.next, b.size = r, size
            self.index(r)
        b.free = False
        return b

    def free(self, b):
        b.free = True
        for n in (b.prev, b.next):
            if n is not None and n.free:
                self.unindex(n)
                if n is b.prev:
                    b.addr, b.prev = n.addr, n.prev
                    if n.prev:
                        n.prev.next = b
                else:
                    b.next = n.next
                    if n.next:
                        n.next.prev = b
                b.size += n.size
        self.index(b)


def replay(events, passes=4):
    """Peak reserved and peak live bytes of `passes` passes over `events`."""
    model = Model()
    live_bytes = peak_live = 0
    for _ in range(passes):
        live = {}
        for e in events:
            op, addr, size = e[0], e[1], e[2]
            if op == "a":
                if addr in live:
                    continue
                live[addr] = (model.alloc(size), size)
                live_bytes += size
                peak_live = max(peak_live, live_bytes)
            elif addr in live:
                b, size = live.pop(addr)
                model.free(b)
                live_bytes -= size
        for b, size in live.values():
            model.free(b)
            live_bytes -= size
    return model.peak, peak_live


def main(paths):
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            events = json.load(f)["events"]
        peak, live = replay(events)
        name = os.path.basename(path).split(".")[0]
        print(f"{name} {peak / max(live, 1):.3f} {peak} {live}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
