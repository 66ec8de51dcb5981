// Whether CUPTI's driver-API callbacks see the driver calls that the CUDA runtime makes for
// `cudaMalloc`/`cudaFree` and `cudaMallocAsync`/`cudaFreeAsync` (what PyTorch and other
// runtime users call), for the observer of CUDA allocations (src/observe/). Prints each
// driver callback's function name at the exit site.
//
//   g++ -O2 tests/gpu/cupti_runtime.cpp -I$CUDA/include -L$CUDA/lib64 -lcudart -lcupti -lcuda -o cupti_runtime
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <cstdio>

static void CUPTIAPI on_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  auto* d = static_cast<const CUpti_CallbackData*>(data);
  if (d->callbackSite == CUPTI_API_EXIT) {
    std::printf("  %s callback: %s (cbid %u)\n", domain == CUPTI_CB_DOMAIN_DRIVER_API ? "driver" : "runtime",
                d->functionName, cbid);
  }
}

int main() {
  CUpti_SubscriberHandle sub;
  if (cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_call, nullptr) != CUPTI_SUCCESS) return 1;
  CUpti_CallbackId ids[] = {CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
                            CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync, CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync,
                            CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz, CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz};
  for (auto id : ids) cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, id);
  void* p = nullptr;
  std::printf("cudaMalloc(1 MiB):\n");
  cudaMalloc(&p, 1 << 20);
  std::printf("cudaFree:\n");
  cudaFree(p);
  cudaStream_t s;
  cudaStreamCreate(&s);
  std::printf("cudaMallocAsync(1 MiB):\n");
  cudaMallocAsync(&p, 1 << 20, s);
  std::printf("cudaFreeAsync:\n");
  cudaFreeAsync(p, s);
  cudaStreamSynchronize(s);
  std::printf("cuMemAlloc (driver, for comparison):\n");
  CUdeviceptr q;
  cuMemAlloc(&q, 1 << 20);
  cuMemFree(q);
  return 0;
}
