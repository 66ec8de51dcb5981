#!/usr/bin/env python3
"""On the device machine: each trace through vramscope and through PyTorch back to back, so
that the two sides of a time ratio are measured seconds apart, not minutes.

    python3 paired.py DIR [ROUNDS]    # every DIR/*.trace.json, plain JSON; ROUNDS default 3

The host's speed changes from one minute to the next (up to 2x on the H100 hosts: BENCHMARKS.md,
"The whole table on an H100, traces gzipped"); run.sh used to replay every trace through
vramscope and then every trace through torch_replay.py, so a trace's two sides could fall in
different phases and the ratio of their medians said more about the host than the allocators.
Here, per round and per trace: vramscope's four replays (`cuMemAlloc` and virtual segments,
recording off and default; `vramscope replay --backend cuda`, as run.sh ran them), and
PyTorch's caching allocator, the cudaMallocAsync pool and cudaMalloc with the very code of
../shared/tools/torch_replay.py (its C++ source, its `encode` and its per-trace loop body are
read from that file, not copied, so it is timed as that script times it: the median of 3 warm
replays). A trace on several streams is also replayed through PyTorch and the pool on its
own streams with the code of torch_streams.py (read from that file likewise) right after
PyTorch's one-stream replay, its JSON line marked `paired_round`, so that its time too is
compared round by round; with as many warm passes as vramscope's (the median of those, as
vramscope's). A one-stream trace goes through torch_streams.py's PyTorch passes too (on its one
stream, no pool), so that table.py can set each side's fastest tenth of passes beside the
medians for every trace. Odd rounds run vramscope
first, even rounds PyTorch first. It prints what run.sh printed (`== replay ...` then
vramscope's JSON; torch_replay.py's JSON line per trace) and a first line `== paired`, so that
table.py compares each round's pair and reports the median of the rounds' ratios.

Expects `vramscope` and `torch_replay.py` beside it (run.sh's folder)."""
import ast
import json
import os
import subprocess
import sys

import torch
from torch.utils.cpp_extension import load_inline

HERE = os.path.dirname(os.path.abspath(__file__))


def script_parts(name):
    """The file `name` beside this one, its C++ source `src`, its `encode` (defined) and its one
    loop over traces `f` (the AST node): what this script runs of torch_replay.py and
    torch_streams.py, read from the files themselves rather than copied."""
    path = os.path.join(HERE, name)
    tree = ast.parse(open(path).read(), path)
    keep = [n for n in tree.body
            if (isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "src" for t in n.targets))
            or (isinstance(n, ast.FunctionDef) and n.name == "encode")]
    loops = [n for n in tree.body if isinstance(n, ast.For) and getattr(n.target, "id", "") == "f"]
    if len(keep) != 2 or len(loops) != 1:
        sys.exit(f"{path}: expected its `src`, `encode` and one loop over traces `f`; the file has changed")
    scope = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), scope)
    return path, scope["src"], scope["encode"], loops[0]


def torch_replay_parts():
    """torch_replay.py's C++ source, its `encode` and its per-trace loop body (compiled): the
    loop body replays the trace named `f` and prints its JSON line."""
    path, src, encode, loop = script_parts("torch_replay.py")
    return src, encode, compile(ast.Module(body=loop.body, type_ignores=[]), path, "exec")


def torch_streams_parts():
    """torch_streams.py's C++ source, its `encode` and its per-trace loop body wrapped in a loop
    over the one trace named `path` (run with `one_stream_too`, it replays one-stream traces
    too, PyTorch's passes only); `None` where the file is not beside this one."""
    if not os.path.exists(os.path.join(HERE, "torch_streams.py")):
        return None
    path, src, encode, loop = script_parts("torch_streams.py")
    one = ast.For(target=ast.Name("f", ast.Store()), iter=ast.List([ast.Name("path", ast.Load())], ast.Load()),
                  body=loop.body, orelse=[])
    return src, encode, compile(ast.fix_missing_locations(ast.Module(body=[one], type_ignores=[])), path, "exec")


def warm_passes(path):
    """vramscope's warm passes for a trace: at least 5, and about 300,000 operations in all."""
    events = json.load(open(path))["events"]
    return max(5, min(1000, 300000 // max(len(events), 1)))


def torch_side(ext, encode, body, path):
    """torch_replay.py's loop body for one trace: its calls, its timing, its JSON line."""
    exec(body, {"f": path, "ext": ext, "encode": encode, "torch": torch, "json": json, "os": os})
    torch.cuda.empty_cache()  # nothing of PyTorch's cache stays reserved while vramscope runs


def vramscope_side(path, warm, round_):
    """run.sh's replays, `warm` warm passes each."""
    name = os.path.basename(path)[: -len(".trace.json")]
    for seg in ("malloc", "virtual"):
        for rec in ("off", "fast"):
            print(f"== replay {name} {seg} {rec} {round_}", flush=True)
            env = dict(os.environ, VRAMSCOPE_CUDA_SEGMENTS=seg)
            cmd = [os.path.join(HERE, "vramscope"), "replay", path, "--backend", "cuda", "--warm", str(warm),
                   "--record", rec, "--json"]
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
                out = p.stdout + p.stderr
            except subprocess.TimeoutExpired:
                out = "timed out after 60 s"
            try:
                r = json.loads(out)
                r["warm_ns_per_op"] = [round(x, 1) for x in r["warm_ns_per_op"]]
                print(json.dumps(r), flush=True)
            except ValueError:
                print(out.strip(), flush=True)


def streams_side(parts, path, round_, warm):
    """torch_streams.py's replay of a trace on its own streams (PyTorch and the pool; on one
    stream PyTorch only), its JSON line marked with the round, so that table.py pairs it with
    vramscope's replays of the same round, seconds apart. As many warm passes as vramscope's
    (`warm`: about 300,000 operations): before, three (torch_streams.py's default of 5
    passes), which on `pipeline_streams` (401 operations) timed a few hundred microseconds, and
    its rounds' ratios spanned 0.25 to 0.88."""
    ext, encode, body = parts
    print(f"== torch streams {os.path.basename(path)} {round_}", flush=True)
    lines = []
    scope = {"path": path, "ext": ext, "encode": encode, "torch": torch, "json": json, "os": os, "passes": warm + 1,
             "one_stream_too": True, "print": lambda line, **_: lines.append(line)}
    exec(body, scope)
    for line in lines:
        d = json.loads(line)
        d["paired_round"] = round_
        print(json.dumps(d), flush=True)
    torch.cuda.empty_cache()


def main():
    folder = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    src, encode, body = torch_replay_parts()
    ext = load_inline("replay_ext", cpp_sources=src, functions=["replay_torch", "replay_async", "replay_malloc", "pair_bench"],
                      with_cuda=True, extra_cflags=["-O2"], verbose=False)
    streams = torch_streams_parts()
    if streams:
        s_src, s_encode, s_body = streams
        s_ext = load_inline("stream_replay_ext", cpp_sources=s_src, functions=["torch_passes", "pool_passes"],
                            with_cuda=True, extra_cflags=["-O2"], verbose=False)
        streams = (s_ext, s_encode, s_body)
    torch.cuda.init()
    traces = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".trace.json"))
    warm = {path: warm_passes(path) for path in traces}
    print("== paired", flush=True)
    for round_ in range(1, rounds + 1):
        for path in traces:
            def pytorch():
                print(f"== torch {os.path.basename(path)} {round_}", flush=True)
                torch_side(ext, encode, body, path)
                if streams:
                    streams_side(streams, path, round_, warm[path])
            if round_ % 2:
                vramscope_side(path, warm[path], round_)
                pytorch()
            else:
                pytorch()
                vramscope_side(path, warm[path], round_)


if __name__ == "__main__":
    main()
