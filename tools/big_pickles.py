#!/usr/bin/env python3
"""Writes two PyTorch snapshot pickles of about the same size from one corpus program: one as
PyTorch records by default (`_record_memory_history()`, C++ frames around the Python ones)
and one with Python stacks only, for timing every report on both (BENCHMARKS.md, "Reports over
large pickles").

    python3 tools/big_pickles.py SIZE_MB OUT_DIR [PROGRAM [LINE_SHIFTS]]

PROGRAM names a program of fixtures/torch/corpus recorded both ways (default
kv_cache_never_reset). Each file is the program's trace repeated until the file reaches
SIZE_MB: repetition r moves every address by r * 2^40 (so its allocations and frees pair up
among themselves) and moves the program's own Python lines by r % LINE_SHIFTS (default 97;
0 moves them by r, so that every repetition has stacks and frames of its own), so that a large
file holds many distinct stacks, as a long recording does. Frames, frame lists and strings stay
shared where PyTorch's file shares them (Python's pickle memo), so the C++ frames cost what
they cost in a real recording.
"""
import io
import os
import pickle
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fixtures", "torch", "corpus")


def repeat(snapshot, programs, reps, shifts=97):
    """The snapshot with its trace repeated `reps` times (see the module's docstring)."""
    trace = snapshot["device_traces"][0]
    out = []
    for rep in range(reps):
        moved = {}  # frame-list id -> the list for this repetition
        shared_frames = {}
        for e in trace:
            frames = e.get("frames", [])
            key = id(frames)
            if key not in moved:
                new = list(frames)
                for i, f in programs[key]:
                    if id(f) not in shared_frames:
                        shared_frames[id(f)] = dict(f, line=f["line"] + (rep % shifts if shifts else rep))
                    new[i] = shared_frames[id(f)]
                moved[key] = new
            n = dict(e, frames=moved[key])
            if "addr" in n:
                n["addr"] = n["addr"] + (rep << 40)
            n["time_us"] = n.get("time_us", 0) + rep * 10**9
            out.append(n)
    return dict(snapshot, device_traces=[out] + snapshot["device_traces"][1:])


def pickled_size(snapshot):
    buf = io.BytesIO()
    pickle.dump(snapshot, buf)
    return buf.tell()


def grow(snapshot, size, shifts=97):
    programs = {}  # id(frame list) -> (index, frame) of the program's own Python lines
    for e in snapshot["device_traces"][0]:
        frames = e.get("frames", [])
        if id(frames) not in programs:
            programs[id(frames)] = [
                (i, f) for i, f in enumerate(frames) if f["filename"].startswith("corpus/")
            ]
    # What one more repetition adds, once the shared frames are written.
    one, two = (pickled_size(repeat(snapshot, programs, n, shifts)) for n in (1, 2))
    reps = max(1, 1 + (size - one) // max(1, two - one))
    return repeat(snapshot, programs, reps, shifts), reps


def main():
    size = int(float(sys.argv[1]) * 1e6)
    out_dir = sys.argv[2]
    program = sys.argv[3] if len(sys.argv) > 3 else "kv_cache_never_reset"
    shifts = int(sys.argv[4]) if len(sys.argv) > 4 else 97
    os.makedirs(out_dir, exist_ok=True)
    for kind, path in [
        ("default", os.path.join(CORPUS, "default_stacks", f"{program}.default.snapshot.pickle")),
        ("python", os.path.join(CORPUS, f"{program}.snapshot.pickle")),
    ]:
        if not os.path.exists(path):
            path = path.replace(CORPUS, os.path.join(CORPUS, "held_out"))
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
        big, reps = grow(snapshot, size, shifts)
        dst = os.path.join(out_dir, f"{program}.{kind}.pickle")
        with open(dst, "wb") as f:
            pickle.dump(big, f)
        events = len(big["device_traces"][0])
        print(f"{dst}: {os.path.getsize(dst):,} bytes, {events:,} events, {reps} repetitions")


if __name__ == "__main__":
    main()
