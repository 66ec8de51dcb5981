#!/usr/bin/env python3
"""Counts the block hovers of PyTorch's memory viewer ("Allocator State History") that would
say a block has no frames, and those whose event carries a scope (`user_metadata`), for
snapshot pickles, without a browser.

    python3 tools/memoryviz/hovers.py PICKLE...

It ports the three parts of PyTorch's `torch/utils/viz/MemoryViz.js` that decide what a block
hover shows: `annotate_snapshot` (a `free_requested` followed by its `free_completed` becomes
one `free` event, which keeps the `free_requested` entry's frames), `MemoryView`'s
`simulate_memory` (selecting event i replays the trace backwards from the snapshot's segments
to just after i: a `free` or `free_completed` puts its block back with the event's frames, an
`alloc` removes it), and `format_frames` (an empty frame list reads "This block has no frames"
in recent versions, "<block was allocated before _record_history was enabled>" in older ones).
Every event is selected in turn, as a click does, and every block drawn is hovered.

`check.py` loads the same pickles in the viewer itself, in headless Chromium, when a copy of
MemoryViz.js is at hand; this script needs only Python.
"""
import pickle
import sys


def annotate(trace):
    """The events the viewer lists: free_requested + free_completed of one address elided."""
    out = []
    for t in trace:
        t = dict(t)
        t.setdefault("frames", [])
        if t["action"] == "free_completed" and out:
            prev = out[-1]
            if prev["action"] == "free_requested" and prev["addr"] == t["addr"]:
                prev["action"] = "free"
                continue
        out.append(t)
    return out


def hovers(snapshot, device):
    events = annotate(snapshot["device_traces"][device])
    blocks = {}
    for seg in snapshot["segments"]:
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                frames = b.get("frames")
                if frames is None:
                    frames = (b.get("history") or [{}])[0].get("frames", [])
                blocks[addr] = (frames, b.get("user_metadata"))
            addr += b["size"]
    total = empty = scoped = 0
    # Selecting event i shows the state after it: the end state with events i+1.. undone.
    state = dict(blocks)
    for i in range(len(events) - 1, -1, -1):
        for frames, meta in state.values():
            total += 1
            empty += not frames
            scoped += bool(meta)
        e = events[i]
        if e["action"] in ("free", "free_completed"):
            state[e["addr"]] = (e["frames"], e.get("user_metadata"))
        elif e["action"] == "alloc":
            state.pop(e["addr"], None)
    return len(events), total, empty, scoped


def main():
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
        for device, trace in enumerate(snapshot["device_traces"]):
            if not trace:
                continue
            n, total, empty, scoped = hovers(snapshot, device)
            print(
                f"{path} (device {device}): {n} events, {total} block hovers over every selected "
                f"event; {empty} say the block has no frames; {scoped} come from an event with a scope"
            )


if __name__ == "__main__":
    main()
