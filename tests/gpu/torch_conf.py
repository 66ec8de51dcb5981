#!/usr/bin/env python3
"""Replays compact traces through PyTorch's caching allocator under each PYTORCH_CUDA_ALLOC_CONF
given, one process per setting (PyTorch reads it once, at CUDA's start), and prints one JSON line
per trace and setting: its peak live bytes, PyTorch's peak reserved and peak allocated bytes
after a cold pass and three warm ones, and the warm passes' median ns an operation. The replay
is torch_replay.py's (../shared/tools), allocations and frees through `raw_alloc`/`raw_delete`
on the current stream; only the caching allocator, so that several settings fit one command.
Needs `pool_pages.py` beside it (the traces' encoding).

    python3 torch_conf.py TRACE_DIR "" "max_split_size_mb:128" "expandable_segments:True"

With FIT=1 in the environment, instead: the smallest memory each trace fits in under each
setting, the allocator capped with `torch.cuda.set_per_process_memory_fraction` (what PyTorch
may reserve), found by bisection to 0.1% of the trace's peak live bytes (a cold pass and a
warm one at each cap): `fits` is the smallest cap tried that ran, `fails` the largest that
ran out of memory.
"""
import glob
import json
import os
import subprocess
import sys

if len(sys.argv) > 2:
    # The parent: one child per setting, each with its own PYTORCH_CUDA_ALLOC_CONF.
    for conf in sys.argv[2:]:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        out = subprocess.run([sys.executable, __file__, sys.argv[1]], env=env, capture_output=True, text=True)
        for line in out.stdout.splitlines():
            print(json.dumps(dict(json.loads(line), conf=conf)), flush=True)
        if out.returncode != 0:
            print(json.dumps(dict(conf=conf, error=out.stderr.strip()[-2000:])), flush=True)
    sys.exit(0)

import torch  # noqa: E402  (only in the child: its setting must be in the environment first)
from torch.utils.cpp_extension import load_inline  # noqa: E402

from pool_pages import encode  # noqa: E402  (slots as torch_replay.py's, and the peak live bytes)

SRC = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <chrono>
#include <vector>
double replay(std::vector<int64_t> op, std::vector<int64_t> slot, std::vector<int64_t> size, int64_t nslots) {
  std::vector<void*> p(nslots, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  try {
    for (size_t i = 0; i < op.size(); i++) {
      if (op[i] == 0) p[slot[i]] = c10::cuda::CUDACachingAllocator::raw_alloc(size[i]);
      else { c10::cuda::CUDACachingAllocator::raw_delete(p[slot[i]]); p[slot[i]] = nullptr; }
    }
  } catch (...) {
    // Out of memory: give back what the pass holds, so that the next trace starts clean.
    for (auto q : p) if (q) c10::cuda::CUDACachingAllocator::raw_delete(q);
    throw;
  }
  auto t1 = std::chrono::steady_clock::now();
  for (auto q : p) if (q) c10::cuda::CUDACachingAllocator::raw_delete(q);
  return std::chrono::duration<double, std::nano>(t1 - t0).count();
}
'''
ext = load_inline("torch_conf_ext", cpp_sources=SRC, functions=["replay"], with_cuda=True,
                  extra_cflags=["-O2"], verbose=False)
torch.cuda.init()


def runs(op, slot, size, n, cap, total):
    """Whether a cold and a warm pass run with PyTorch allowed `cap` bytes of `total`."""
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
    try:
        ext.replay(op, slot, size, n)
        ext.replay(op, slot, size, n)
        return True
    except RuntimeError:
        return False
    finally:
        torch.cuda.empty_cache()


if os.environ.get("FIT"):
    total = torch.cuda.mem_get_info()[1]
    for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.trace.json"))):
        op, slot, size, n, peak = encode(json.load(open(f))["events"])
        torch.cuda.reset_peak_memory_stats()
        runs(op, slot, size, n, total, total)
        free_run = torch.cuda.memory_stats()["reserved_bytes.all.peak"]
        lo, hi = peak - 1, free_run + (2 << 20)
        # Capped, PyTorch may need more than it reserved uncapped (expandable segments map the
        # large pool in 20 MiB pieces): up in steps of 5% until a run.
        while not runs(op, slot, size, n, hi, total):
            lo, hi = hi, int(hi * 1.05)
            if hi > total:
                break
        if hi > total:
            print(json.dumps(dict(trace=os.path.basename(f), error="no run on the whole device")), flush=True)
            continue
        while hi - lo > max(peak // 1000, 1 << 20):
            mid = (lo + hi) // 2
            if runs(op, slot, size, n, mid, total):
                hi = mid
            else:
                lo = mid
        print(json.dumps(dict(trace=os.path.basename(f), peak_live=peak, fits=hi, fails=lo,
                              unconstrained=free_run, device_total=total)), flush=True)
    sys.exit(0)

for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.trace.json"))):
    op, slot, size, n, peak = encode(json.load(open(f))["events"])
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        ext.replay(op, slot, size, n)
        warm = sorted(ext.replay(op, slot, size, n) for _ in range(3))
    except RuntimeError as e:
        print(json.dumps(dict(trace=os.path.basename(f), error=str(e).splitlines()[0][:300])), flush=True)
        continue
    st = torch.cuda.memory_stats()
    print(json.dumps(dict(trace=os.path.basename(f), ops=len(op), peak_live=peak,
                          torch_peak_reserved=st["reserved_bytes.all.peak"],
                          torch_peak_alloc=st["allocated_bytes.all.peak"],
                          torch_warm_ns_op=round(warm[1] / len(op), 1),
                          num_alloc_retries=st["num_alloc_retries"])), flush=True)
