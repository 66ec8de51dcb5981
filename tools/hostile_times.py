#!/usr/bin/env python3
"""Times the command line on the round-four hostile inputs, each built here from its
description: what each answer or refusal costs in time and memory, in a release build, beside
the targets (a refusal within 1 s, an answer within 5 s, under 1 GB). The tests check each
input's answer; this measures.

    cargo build --release -p vramscope-cli
    python3 tools/hostile_times.py [target/release/vramscope] [WORK_DIR]
"""
import gzip
import json
import os
import pickle
import subprocess
import sys
import zlib

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/vramscope"
WORK = sys.argv[2] if len(sys.argv) > 2 else "/tmp/vramscope-hostile-times"
os.makedirs(WORK, exist_ok=True)


def gz_stream(path, head, chunk, times, tail):
    """`head` + `chunk` * `times` + `tail`, gzipped, written without holding it whole."""
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(z.compress(head))
        for _ in range(times):
            f.write(z.compress(chunk))
        f.write(z.compress(tail))
        f.write(z.flush())


def build():
    out = []
    p = f"{WORK}/spaces.json.gz"  # `{` and 3.9 GiB of spaces
    if not os.path.exists(p):
        gz_stream(p, b"{", b" " * (64 << 20), 62, b"")
    out.append(("`{` + 3.9 GiB of spaces, gzipped", ["summary", p], "refuse"))
    p = f"{WORK}/events.trace.json.gz"  # 1 GiB of events for replay
    if not os.path.exists(p):
        ev = b'["a",1,512,0],'
        gz_stream(p, b'{"events":[', ev * (1 << 16), (1 << 30) // (len(ev) << 16), b'["f",1,512,0]]}')
    out.append(("1 GiB of trace events, gzipped", ["replay", p], "either"))
    p = f"{WORK}/stacks.json.gz"  # 1 GiB of empty stacks
    if not os.path.exists(p):
        gz_stream(p, b'{"version":7,"stacks":[', b"[]," * (1 << 20), (1 << 30) // (3 << 20), b'[]]}')
    out.append(("1 GiB of empty stacks, gzipped", ["summary", p], "either"))
    p = f"{WORK}/identical.pickle.gz"  # 8 million identical events
    if not os.path.exists(p):
        e = {"action": "alloc", "addr": 0, "size": 512, "stream": 0, "time_us": 0, "frames": []}
        snap = {"segments": [], "device_traces": [[e] * 8_000_000]}
        with gzip.open(p, "wb", compresslevel=6) as f:
            pickle.dump(snap, f, protocol=4)
    out.append(("8 million identical events, pickled and gzipped", ["summary", p], "either"))
    p = f"{WORK}/devices.pickle"  # 20,000 devices sharing one 2,000-frame stack
    if not os.path.exists(p):
        frames = [{"filename": f"f{i}.py", "line": i, "name": f"fn{i}"} for i in range(2000)]
        trace = [{"action": "alloc", "addr": i * 512, "size": 512, "stream": 0, "time_us": i, "frames": frames}
                 for i in range(20_000)]
        snap = {"segments": [], "device_traces": [[t] for t in trace]}
        with open(p, "wb") as f:
            pickle.dump(snap, f, protocol=4)
    out.append(("20,000 devices sharing a 2,000-frame stack", ["summary", p], "either"))
    p = f"{WORK}/sparse.json"  # a sparse 3 GB file holding `{`
    if not os.path.exists(p):
        with open(p, "wb") as f:
            f.write(b"{")
            f.truncate(3 << 30)
    out.append(("a sparse 3 GB file holding `{`", ["summary", p], "refuse"))
    p = f"{WORK}/huge.trace.json"  # one 6 GB allocation on the host backend
    if not os.path.exists(p):
        with open(p, "w") as f:
            json.dump({"events": [["a", 1, 6 << 30, 0], ["f", 1, 6 << 30, 0]]}, f)
    out.append(("one 6 GB allocation replayed on the host", ["replay", "--backend", "host", p], "either"))
    out.append(("a capacity near 2^64", ["replay", "--capacity", "16777215TiB", p], "either"))
    return out


def main():
    print(f"{'input':<50} {'exit':>4} {'s':>6} {'MB':>6}  first line")
    for name, args, _ in build():
        r = subprocess.run(["/usr/bin/time", "-f", "%e %M", BIN, *args], capture_output=True, text=True)
        lines = r.stderr.strip().splitlines()
        took, kb = lines[-1].split()
        said = (lines[0] if len(lines) > 1 else r.stdout.strip().splitlines()[0] if r.stdout.strip() else "")
        print(f"{name:<50} {r.returncode:>4} {float(took):>6.2f} {int(kb) // 1024:>6}  {said[:60]}")


if __name__ == "__main__":
    main()
