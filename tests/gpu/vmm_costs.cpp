// What each CUDA virtual-memory call costs on the device machine, for the design of the CUDA
// backend's virtual segments (src/backend/cuda/virtual_memory.rs): physical memory created and
// mapped a 2 MiB page at a time against one run per range, the access call, unmapping, and
// synchronizing the context against one stream. Also whether one cuMemUnmap may cover several
// mappings, and whether it may cover part of one.
//
//   g++ -O2 -std=c++17 tests/gpu/vmm_costs.cpp -I/usr/local/cuda/include -lcuda -o vmm_costs
//   ./vmm_costs
#include <cuda.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                    \
  do {                                                                           \
    CUresult r_ = (x);                                                           \
    if (r_ != CUDA_SUCCESS) {                                                    \
      const char* s_ = nullptr;                                                  \
      cuGetErrorString(r_, &s_);                                                 \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);        \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

static double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

static CUmemAllocationProp prop;
static CUmemAccessDesc access_desc;
static size_t page;

// Maps [base, base + len) a page at a time (create + map each, one access call): PyTorch's
// expandable segments and vramscope before this change. Returns the handles.
static std::vector<CUmemGenericAllocationHandle> map_pages(CUdeviceptr base, size_t len) {
  std::vector<CUmemGenericAllocationHandle> hs;
  for (size_t off = 0; off < len; off += page) {
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, page, &prop, 0));
    CK(cuMemMap(base + off, page, 0, h, 0));
    hs.push_back(h);
  }
  CK(cuMemSetAccess(base, len, &access_desc, 1));
  return hs;
}

static void unmap_pages(CUdeviceptr base, const std::vector<CUmemGenericAllocationHandle>& hs) {
  for (size_t i = 0; i < hs.size(); i++) {
    CK(cuMemUnmap(base + i * page, page));
    CK(cuMemRelease(hs[i]));
  }
}

static CUmemGenericAllocationHandle map_run(CUdeviceptr base, size_t len) {
  CUmemGenericAllocationHandle h;
  CK(cuMemCreate(&h, len, &prop, 0));
  CK(cuMemMap(base, len, 0, h, 0));
  CK(cuMemSetAccess(base, len, &access_desc, 1));
  return h;
}

int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  char name[256];
  CK(cuDeviceGetName(name, sizeof name, dev));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  access_desc.location = prop.location;
  access_desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  std::printf("%s, page %zu bytes\n", name, page);

  const size_t reserve = size_t(8) << 30;
  CUdeviceptr base;
  CK(cuMemAddressReserve(&base, reserve, page, 0, 0));

  std::printf("%10s %22s %22s %22s %22s\n", "MiB", "pages: map us", "pages: unmap us", "run: map us",
              "run: unmap us");
  for (size_t mib : {2, 8, 32, 128, 512, 2048}) {
    size_t len = mib << 20;
    double best[4] = {1e18, 1e18, 1e18, 1e18};
    for (int rep = 0; rep < 3; rep++) {
      double t0 = now_us();
      auto hs = map_pages(base, len);
      double t1 = now_us();
      unmap_pages(base, hs);
      double t2 = now_us();
      auto h = map_run(base, len);
      double t3 = now_us();
      CK(cuMemUnmap(base, len));
      CK(cuMemRelease(h));
      double t4 = now_us();
      double v[4] = {t1 - t0, t2 - t1, t3 - t2, t4 - t3};
      for (int i = 0; i < 4; i++) best[i] = v[i] < best[i] ? v[i] : best[i];
    }
    std::printf("%10zu %22.1f %22.1f %22.1f %22.1f\n", mib, best[0], best[1], best[2], best[3]);
  }

  // Parts of a run: create, map, access, unmap, release, for 512 MiB.
  {
    size_t len = size_t(512) << 20;
    CUmemGenericAllocationHandle h;
    double t0 = now_us();
    CK(cuMemCreate(&h, len, &prop, 0));
    double t1 = now_us();
    CK(cuMemMap(base, len, 0, h, 0));
    double t2 = now_us();
    CK(cuMemSetAccess(base, len, &access_desc, 1));
    double t3 = now_us();
    CK(cuMemUnmap(base, len));
    double t4 = now_us();
    CK(cuMemRelease(h));
    double t5 = now_us();
    std::printf("512 MiB run: create %.1f us, map %.1f, access %.1f, unmap %.1f, release %.1f\n", t1 - t0,
                t2 - t1, t3 - t2, t4 - t3, t5 - t4);
  }

  // One unmap over several mappings; an unmap of part of one.
  {
    auto hs = map_pages(base, 4 * page);
    CUresult r = cuMemUnmap(base, 4 * page);
    std::printf("one cuMemUnmap over 4 page mappings: %s\n", r == CUDA_SUCCESS ? "allowed" : "refused");
    if (r != CUDA_SUCCESS) {
      unmap_pages(base, hs);
    } else {
      for (auto h : hs) CK(cuMemRelease(h));
    }
    auto h = map_run(base, 4 * page);
    r = cuMemUnmap(base + page, page);
    std::printf("cuMemUnmap of one page inside a 4-page mapping: %s\n", r == CUDA_SUCCESS ? "allowed" : "refused");
    if (r != CUDA_SUCCESS) CK(cuMemUnmap(base, 4 * page));
    else {
      cuMemUnmap(base, page);
      cuMemUnmap(base + 2 * page, 2 * page);
    }
    CK(cuMemRelease(h));
    // Map part of one handle (its first half).
    CK(cuMemCreate(&h, 4 * page, &prop, 0));
    r = cuMemMap(base, 2 * page, 0, h, 0);
    std::printf("cuMemMap of part of a handle: %s\n", r == CUDA_SUCCESS ? "allowed" : "refused");
    if (r == CUDA_SUCCESS) CK(cuMemUnmap(base, 2 * page));
    CK(cuMemRelease(h));
  }

  // Synchronizing: the whole context against one stream, idle.
  {
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    double best_ctx = 1e18, best_stream = 1e18;
    for (int i = 0; i < 1000; i++) {
      double t0 = now_us();
      CK(cuCtxSynchronize());
      double t1 = now_us();
      CK(cuStreamSynchronize(s));
      double t2 = now_us();
      best_ctx = std::min(best_ctx, t1 - t0);
      best_stream = std::min(best_stream, t2 - t1);
    }
    CUevent e;
    CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    double best_query = 1e18;
    for (int i = 0; i < 1000; i++) {
      CK(cuEventRecord(e, s));
      double t0 = now_us();
      CK(cuEventSynchronize(e));
      best_query = std::min(best_query, now_us() - t0);
    }
    std::printf("idle: cuCtxSynchronize %.2f us, cuStreamSynchronize %.2f us, record + cuEventSynchronize %.2f us\n",
                best_ctx, best_stream, best_query);
    // Another stream busy (20 memsets of 1 GiB): what an unmap waits for when it synchronizes
    // the context, against its own (idle) stream.
    CUstream busy;
    CK(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
    CUdeviceptr big;
    CK(cuMemAlloc(&big, size_t(1) << 30));
    for (int k = 0; k < 2; k++) {
      for (int i = 0; i < 20; i++) CK(cuMemsetD8Async(big, i, size_t(1) << 30, busy));
      double t0 = now_us();
      CK(cuStreamSynchronize(s));
      double t1 = now_us();
      CK(cuCtxSynchronize());
      double t2 = now_us();
      std::printf("another stream busy: cuStreamSynchronize(own stream) %.1f us, cuCtxSynchronize %.1f us\n",
                  t1 - t0, t2 - t1);
    }
    CK(cuMemFree(big));
  }
  CK(cuMemAddressFree(base, reserve));
  return 0;
}
