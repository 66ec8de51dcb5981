# On the device machine: replays the traces that allocate on several streams through PyTorch's
# caching allocator and the cudaMallocAsync pool *on as many streams as the trace names*, so
# that their peaks and warm driver calls compare like for like with `vramscope replay --backend
# cuda` (../shared/tools/torch_replay.py replays every trace on one stream).
#
#   python3 torch_streams.py DIR [PASSES]   # every DIR/*.trace.json with more than one stream
#
# (paired.py runs its per-trace loop on one-stream traces too, PyTorch's passes only, for
# their time pass by pass.)
#
# PyTorch: `raw_alloc_with_stream` on the stream the trace names (trace stream 0 is the default
# stream, the others streams of their own), `raw_delete` (the block goes back to the pool of
# the stream it was allocated on, as in the recorded program). The pool: `cudaMallocAsync` and
# `cudaFreeAsync` on the stream the trace names, with the pool's default reuse policies (which
# let a stream reuse memory freed on another once the free has completed). Each prints one
# JSON line per trace: peak reserved, and segments reserved (PyTorch's `segment.all.allocated`: its `cudaMalloc` calls) in each
# warm pass. The host time per operation is printed too (the median of the warm passes, and
# each warm pass's: the device host's speed changes within a process, BENCHMARKS.md, "The
# host's two speeds are phases"), but it is not like for like with
# vramscope's replay unless both ran the same streams: compare peaks and calls.
import os, sys, json, glob
import torch
from torch.utils.cpp_extension import load_inline

src = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>
#include <chrono>
#include <vector>
#include <cstdint>
using clk = std::chrono::steady_clock;
static std::vector<cudaStream_t> streams(int64_t n){
  std::vector<cudaStream_t> s(n, nullptr);
  for(int64_t i=1;i<n;i++) cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking);
  return s;
}
static void destroy(std::vector<cudaStream_t>& s){
  for(size_t i=1;i<s.size();i++) cudaStreamDestroy(s[i]);
}
// One pass per call: returns {ns, device allocs after the pass}.
std::vector<double> torch_passes(std::vector<int64_t> op, std::vector<int64_t> slot,
    std::vector<int64_t> size, std::vector<int64_t> stream, int64_t nslots, int64_t nstreams,
    int64_t passes){
  auto s = streams(nstreams);
  std::vector<double> out;
  for(int64_t k=0;k<passes;k++){
    std::vector<void*> p(nslots, nullptr);
    auto t0=clk::now();
    for(size_t i=0;i<op.size();i++){
      if(op[i]==0) p[slot[i]]=c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(size[i], s[stream[i]]);
      else { c10::cuda::CUDACachingAllocator::raw_delete(p[slot[i]]); p[slot[i]]=nullptr; }
    }
    auto t1=clk::now();
    for(auto q: p) if(q) c10::cuda::CUDACachingAllocator::raw_delete(q);
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    out.push_back(std::chrono::duration<double,std::nano>(t1-t0).count());
    out.push_back((double)st.segment[0].allocated);  // segments reserved: cudaMalloc calls
  }
  cudaDeviceSynchronize();
  destroy(s);
  return out;
}
std::vector<double> pool_passes(std::vector<int64_t> op, std::vector<int64_t> slot,
    std::vector<int64_t> size, std::vector<int64_t> stream, int64_t nslots, int64_t nstreams,
    int64_t passes){
  cudaMemPool_t pool; cudaDeviceGetDefaultMemPool(&pool, 0);
  uint64_t thr = UINT64_MAX; cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr);
  uint64_t zero=0; cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
  auto s = streams(nstreams);
  for(int64_t i=0;i<nstreams;i++) if(!s[i]) cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking);
  std::vector<double> out;
  std::vector<void*> p(nslots, nullptr);
  std::vector<int64_t> on(nslots, 0);
  for(int64_t k=0;k<passes;k++){
    auto t0=clk::now();
    for(size_t i=0;i<op.size();i++){
      if(op[i]==0){
        if(cudaMallocAsync(&p[slot[i]], size[i], s[stream[i]])!=cudaSuccess) return {-1.0};
        on[slot[i]] = stream[i];
      } else { cudaFreeAsync(p[slot[i]], s[on[slot[i]]]); p[slot[i]]=nullptr; }
    }
    auto t1=clk::now();
    for(size_t j=0;j<p.size();j++) if(p[j]){ cudaFreeAsync(p[j], s[on[j]]); p[j]=nullptr; }
    cudaDeviceSynchronize();
    uint64_t high=0; cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high);
    out.push_back(std::chrono::duration<double,std::nano>(t1-t0).count());
    out.push_back((double)high);
  }
  uint64_t keep=0; cudaMemPoolTrimTo(pool, keep);
  for(auto x: s) cudaStreamDestroy(x);
  return out;
}
'''
ext = load_inline("stream_replay_ext", cpp_sources=src, functions=["torch_passes", "pool_passes"],
                  with_cuda=True, extra_cflags=["-O2"], verbose=False)
torch.cuda.init()


def encode(events):
    """Slots for addresses, stream indices in order of first use (the trace's stream 0 first)."""
    op, slot, size, stream = [], [], [], []
    live, freelist, n = {}, [], 0
    names = {0: 0}
    alloc = peak = 0
    per_stream, per_stream_peak = {}, {}
    for e in events:
        k, addr, sz = e[0], e[1], e[2]
        sid = names.setdefault(e[3] if len(e) > 3 else 0, len(names))
        if k == "a":
            if addr in live:
                continue
            s = freelist.pop() if freelist else n
            if s == n:
                n += 1
            live[addr] = (s, sz, sid)
            op.append(0); slot.append(s); size.append(sz); stream.append(sid)
            alloc += sz; peak = max(peak, alloc)
            per_stream[sid] = per_stream.get(sid, 0) + sz
            per_stream_peak[sid] = max(per_stream_peak.get(sid, 0), per_stream[sid])
        else:
            if addr not in live:
                continue
            s, sz0, sid0 = live.pop(addr)
            freelist.append(s)
            op.append(1); slot.append(s); size.append(0); stream.append(sid0)
            alloc -= sz0; per_stream[sid0] -= sz0
    return op, slot, size, stream, n, len(names), peak, sum(per_stream_peak.values())


passes = int(sys.argv[2]) if len(sys.argv) > 2 else 5
# paired.py sets this to time PyTorch pass by pass on one-stream traces too (on their one
# stream, the default one, as torch_replay.py's replay: `raw_alloc_with_stream` there is
# `raw_alloc`), so that their fastest tenth is compared as on several streams.
one_stream_too = False
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.trace.json"))):
    ev = json.load(open(f))["events"]
    op, slot, size, stream, n, ns, peak, sum_peaks = encode(ev)
    if ns < 2 and not one_stream_too:
        continue
    res = dict(trace=os.path.basename(f), ops=len(op), streams=ns, peak_live=peak,
               sum_of_stream_peaks=sum_peaks)
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_stats()["segment.all.allocated"]
    t = ext.torch_passes(op, slot, size, stream, n, ns, passes)
    calls = [int(c) for c in t[1::2]]
    st = torch.cuda.memory_stats()
    res.update(torch_peak_reserved=st["reserved_bytes.all.peak"],
               torch_segments_per_pass=[b - a for a, b in zip([before] + calls, calls)],
               torch_warm_ns_op=round(sorted(t[2::2])[len(t[2::2]) // 2] / len(op), 1),
               torch_warm_ns_op_passes=[round(x / len(op), 1) for x in t[2::2]])
    torch.cuda.empty_cache()
    # On one stream only PyTorch's passes: their time beside vramscope's (paired.py); the
    # pool's peak there is torch_replay.py's.
    a = ext.pool_passes(op, slot, size, stream, n, ns, passes) if ns > 1 else None
    if a is not None and len(a) == 1:
        res.update(pool_error="cudaMallocAsync failed")
    elif a is not None:
        res.update(pool_peak_reserved=int(a[-1]), pool_warm_ns_op=round(sorted(a[2::2])[len(a[2::2]) // 2] / len(op), 1))
    print(json.dumps(res), flush=True)
