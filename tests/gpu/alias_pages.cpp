// One physical allocation mapped at eight address ranges: writes through one, reads through another,
// and what cuMemGetInfo counts (the allocation once). Then a range made of parts of allocations,
// which cuMemMap refuses (it maps whole allocations only). Run by tests/gpu/staggered.sh.
#include <cuda.h>
#include <cstdio>
#include <cstring>
#include <vector>
#define CK(x) do{CUresult r=(x); if(r){const char*s;cuGetErrorString(r,&s);printf("%s failed: %s\n",#x,s);return 1;}}while(0)
int main(){
  CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d,0)); CUcontext c; CK(cuDevicePrimaryCtxRetain(&c,d)); CK(cuCtxSetCurrent(c));
  CUmemAllocationProp p; memset(&p,0,sizeof p); p.type=CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type=CU_MEM_LOCATION_TYPE_DEVICE; p.location.id=0;
  size_t g; CK(cuMemGetAllocationGranularity(&g,&p,CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t sz = 512ull<<20; size_t f0,t0,f1,f2; CK(cuMemGetInfo(&f0,&t0));
  CUmemGenericAllocationHandle h; CK(cuMemCreate(&h,sz,&p,0)); CK(cuMemGetInfo(&f1,&t0));
  const int V=8; std::vector<CUdeviceptr> va(V);
  CUmemAccessDesc a; a.location=p.location; a.flags=CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for(int i=0;i<V;i++){ CK(cuMemAddressReserve(&va[i],sz,0,0,0)); CK(cuMemMap(va[i],sz,0,h,0)); CK(cuMemSetAccess(va[i],sz,&a,1)); }
  CK(cuMemGetInfo(&f2,&t0));
  CK(cuMemsetD8(va[0],7,sz)); unsigned char b=0; CK(cuMemcpyDtoH(&b,va[V-1]+sz-1,1));
  printf("granularity %zu; physical %zu MiB mapped at %d ranges: free fell %zu MiB at create, %zu MiB more after %d maps; wrote 7 via range 0, read %d via range %d\n",
    g, sz>>20, V, (f0-f1)>>20, (f1-f2)>>20, V, b, V-1);
  // a view made of pieces: 4 chunks of 2 MiB from two handles, in swapped order
  CUmemGenericAllocationHandle h2; CK(cuMemCreate(&h2,4*g,&p,0)); CUdeviceptr w; CK(cuMemAddressReserve(&w,4*g,0,0,0));
  CK(cuMemMap(w,g,2*g,h2,0)); CK(cuMemMap(w+g,g,0,h2,0)); CK(cuMemMap(w+2*g,2*g,g,h,0));
  CK(cuMemSetAccess(w,4*g,&a,1)); CK(cuMemsetD8(w,9,4*g)); CK(cuMemcpyDtoH(&b,va[3]+g,1));
  printf("a 4-chunk view over two handles at offsets (h2:2,h2:0,h:1,h:2): written 9, read %d through h's range 3 at chunk 1\n", b);
  return 0;
}
