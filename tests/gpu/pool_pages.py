#!/usr/bin/env python3
"""Does the cudaMallocAsync pool map memory in its warm passes? For "Why the pool's peak is out of
reach" (BENCHMARKS.md): replays each trace through the pool as `torch_replay.py` does (one
stream, release threshold at its maximum so that nothing is trimmed, four passes, a
synchronization after each), records the address of every allocation, and prints per pass the
pool's reserved bytes (`cudaMemPoolAttrReservedMemCurrent`) at its end and the distinct 2 MiB
pages of address space that the pass's allocations lay in.

Why that decides it: a byte in use lies in a mapped page, and 2 MiB is the smallest granule the
driver maps. If a pass's allocations lie in more distinct pages than the pool holds reserved
through the whole pass (its reserved bytes only grow: nothing is trimmed), some physical memory
was mapped at two addresses during the pass, or more was mapped: work inside the driver in a
warm pass either way, of the kind vramscope's target forbids (a `cuMemMap`). The converse does
not hold: a pass that fits its pages may still have remapped.

    python3 tests/gpu/pool_pages.py [--dump DIR] TRACE...    (one JSON line per trace)
    python3 tests/gpu/pool_pages.py --table LOG      (V=1: also a line per trace)

`--table LOG` reads the log of `pool_pages.sh` (this script's lines, then vramscope's replays)
and prints, per segment kind, on how many single-stream traces vramscope's peak reserved is at
most the pool's, and at most what the pool would hold without mapping in its warm passes (its
warm pages or its reserved bytes, whichever is more).

With `--dump DIR`, also writes `DIR/NAME.addrs.json` per trace: the sizes of its allocations
in trace order and the address the pool gave each in every pass, to study where it places them.
"""
import gzip
import json
import math
import os
import sys

SRC = r'''
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <vector>
#include <cstdint>
// Per pass: the address of each allocation in trace order, then the pool's reserved bytes
// after the pass. The last element: the pool's reserved high-water mark.
std::vector<int64_t> pool_pages(std::vector<int64_t> op, std::vector<int64_t> slot,
                                std::vector<int64_t> size, int64_t nslots, int64_t passes) {
  cudaMemPool_t pool; cudaDeviceGetDefaultMemPool(&pool, 0);
  uint64_t thr = UINT64_MAX; cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr);
  uint64_t zero = 0; cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::vector<void*> p(nslots, nullptr);
  std::vector<int64_t> out;
  for (int k = 0; k < passes; k++) {
    for (size_t i = 0; i < op.size(); i++) {
      if (op[i] == 0) {
        if (cudaMallocAsync(&p[slot[i]], size[i], s) != cudaSuccess) return {-1};
        out.push_back((int64_t)(uintptr_t)p[slot[i]]);
      } else { cudaFreeAsync(p[slot[i]], s); p[slot[i]] = nullptr; }
    }
    cudaStreamSynchronize(s);
    for (auto& q : p) if (q) { cudaFreeAsync(q, s); q = nullptr; }
    cudaStreamSynchronize(s);
    uint64_t cur = 0; cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &cur);
    out.push_back((int64_t)cur);
  }
  uint64_t high = 0; cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high);
  out.push_back((int64_t)high);
  uint64_t keep = 0; cudaMemPoolTrimTo(pool, keep);
  cudaStreamDestroy(s);
  return out;
}
'''

PAGE = 2 << 20
PASSES = 4


def encode(events):
    """Slots as in `torch_replay.py`: op 0 allocates `size` into a slot, 1 frees it."""
    op, slot, size, live, free, n, cur, peak = [], [], [], {}, [], 0, 0, 0
    for e in events:
        kind, addr, sz = e[0], e[1], e[2]
        if kind == "a":
            if addr in live:
                continue
            s = free.pop() if free else n
            n += s == n
            live[addr] = (s, sz)
            op.append(0), slot.append(s), size.append(sz)
            cur += sz
            peak = max(peak, cur)
        elif addr in live:
            s, sz = live.pop(addr)
            free.append(s)
            op.append(1), slot.append(s), size.append(0)
            cur -= sz
    return op, slot, size, n, peak


def short(trace):
    """A trace's file name without its suffixes."""
    return trace.removesuffix(".gz").removesuffix(".trace.json")


def table(log):
    pool, ours, name = {}, {}, None
    for line in open(log):
        if line.startswith("== replay "):
            _, _, name, seg = line.split()
        elif line.startswith("{") and '"pool_peak_reserved"' in line:
            r = json.loads(line)
            pool[r["trace"]] = r
        elif line.startswith("{") and name:
            r = json.loads(line)
            ours[(name, seg)] = r
            name = None
    remapping = sum(r["warm_passes_remapping"] > 0 for r in pool.values())
    print(f"{len(pool)} traces; the pool's warm allocations lie in more pages than it holds on "
          f"{remapping}")
    for seg in ("virtual", "malloc"):
        every = [(pool[n], r) for (n, s), r in ours.items() if s == seg and n in pool]
        if os.environ.get("V"):
            # One line per trace, several streams included (the pool replays them on one).
            for p, r in sorted(every, key=lambda x: x[0]["trace"]):
                live = p["peak_live"]
                fixed = max([p["pool_peak_reserved"]] + [q["pages_bytes"] for q in p["passes"][1:]])
                print(f"  {seg} {short(p['trace'])}: "
                      f"streams {r['streams']}, vramscope {r['peak_reserved_bytes'] / live:.3f}, "
                      f"pool {p['pool_peak_reserved'] / live:.3f}, pool without mapping "
                      f"{fixed / live:.3f}, pool's warm passes mapping {p['warm_passes_remapping']}")
        rows = [(p, r) for p, r in every if r["streams"] == 1]
        met = met_fixed = remap_where_lower = calls = late = 0
        logs = [0.0, 0.0, 0.0]
        missed = []
        for p, r in rows:
            live = p["peak_live"]
            mine = r["peak_reserved_bytes"] / live
            theirs = p["pool_peak_reserved"] / live
            fixed = max([p["pool_peak_reserved"]] + [q["pages_bytes"] for q in p["passes"][1:]]) / live
            met += mine <= theirs + 5e-4
            met_fixed += mine <= fixed + 5e-4
            if mine > fixed + 5e-4:
                missed.append(f"{short(p['trace'])} {mine:.3f} against {fixed:.3f}")
            remap_where_lower += mine > theirs + 5e-4 and p["warm_passes_remapping"] > 0
            calls += sum(r["warm_device_calls"])
            late += sum(r["warm_device_calls"][2:])
            for i, v in enumerate((mine, theirs, fixed)):
                logs[i] += math.log(v)
        n = max(len(rows), 1)
        g = [math.exp(x / n) for x in logs]
        print(f"{seg}: {len(rows)} single-stream traces; peak at most the pool's on {met}; of the "
              f"{len(rows) - met} others the pool maps in its warm passes on {remap_where_lower}; "
              f"at most what the pool holds without that on {met_fixed}; geometric means: "
              f"vramscope {g[0]:.4f}, pool {g[1]:.4f}, pool without mapping {g[2]:.4f}; "
              f"vramscope's driver calls in warm passes {calls}, after the second {late}")
        if len(missed) <= 10:
            print("  above what the pool holds without mapping: " + (", ".join(missed) or "none"))


def main():
    if sys.argv[1:2] == ["--table"]:
        return table(sys.argv[2])
    import torch
    from torch.utils.cpp_extension import load_inline

    ext = load_inline("pool_pages_ext", cpp_sources=SRC, functions=["pool_pages"], with_cuda=True,
                      extra_cflags=["-O2"], verbose=False)
    torch.cuda.init()
    args, dump = sys.argv[1:], None
    if args[:1] == ["--dump"]:
        dump, args = args[1], args[2:]
    for path in args:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            op, slot, size, n, peak = encode(json.load(f)["events"])
        out = ext.pool_pages(op, slot, size, n, PASSES)
        if out == [-1]:
            print(json.dumps(dict(trace=path.split("/")[-1], error="cudaMallocAsync failed")), flush=True)
            continue
        sizes = [s for o, s in zip(op, size) if o == 0]
        per = len(sizes) + 1
        passes = []
        for k in range(PASSES):
            chunk = out[k * per:(k + 1) * per]
            pages = set()
            for a, s in zip(chunk[:-1], sizes):
                pages.update(range(a // PAGE, (a + max(s, 1) - 1) // PAGE + 1))
            passes.append(dict(pages_bytes=len(pages) * PAGE, reserved=chunk[-1]))
        if dump:
            addrs = [out[k * per:(k + 1) * per - 1] for k in range(PASSES)]
            with open(f"{dump}/{path.split('/')[-1]}.addrs.json", "w") as f:
                json.dump(dict(sizes=sizes, addrs=addrs), f)
        high = out[-1]
        warm = passes[1:]
        print(json.dumps(dict(
            trace=path.split("/")[-1], peak_live=peak, pool_peak_reserved=high,
            passes=passes,
            # Warm passes whose allocations lie in more pages than the pool held: remapped.
            warm_passes_remapping=sum(p["pages_bytes"] > p["reserved"] for p in warm),
            warm_pages_over_reserved=max(p["pages_bytes"] / p["reserved"] for p in warm),
        )), flush=True)


if __name__ == "__main__":
    main()
