// What aliasing pages would cost (BENCHMARKS.md, "A trace no fixed layout fits"): pages as their
// own allocations mapped into one range, against one allocation mapped as a run; then many views
// over the same pages (time, and what the driver takes of device memory for them); a byte written
// through the range, read through a view. On the device machine:
//   nvcc -O2 -o alias_costs tests/gpu/alias_costs.cpp -lcuda && ./alias_costs PAGES VIEWS PAGES_PER_VIEW
// (H200: docs/lab/runs/h200-alias-costs.txt, with 512 160 256 twice
// and 4096 40 2048).
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include <algorithm>
#define CK(x) do{CUresult r=(x); if(r){const char*s;cuGetErrorString(r,&s);printf("%s failed: %s\n",#x,s);return 1;}}while(0)
using clk=std::chrono::steady_clock;
static double us(clk::time_point a){return std::chrono::duration<double,std::micro>(clk::now()-a).count();}
int main(int argc,char**argv){
  int pages = argc>1?atoi(argv[1]):512, views = argc>2?atoi(argv[2]):160, per = argc>3?atoi(argv[3]):256;
  CK(cuInit(0)); CUdevice d; CK(cuDeviceGet(&d,0)); CUcontext c; CK(cuDevicePrimaryCtxRetain(&c,d)); CK(cuCtxSetCurrent(c));
  CUmemAllocationProp p; memset(&p,0,sizeof p); p.type=CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type=CU_MEM_LOCATION_TYPE_DEVICE; p.location.id=0;
  size_t g; CK(cuMemGetAllocationGranularity(&g,&p,CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemAccessDesc a; a.location=p.location; a.flags=CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t f0,t,f1,f2,f3;
  // one run: one allocation of `pages` pages
  CK(cuMemGetInfo(&f0,&t));
  auto t0=clk::now(); CUmemGenericAllocationHandle run; CK(cuMemCreate(&run,pages*g,&p,0)); double create_run=us(t0);
  CUdeviceptr rbase; CK(cuMemAddressReserve(&rbase,pages*g,0,0,0));
  t0=clk::now(); CK(cuMemMap(rbase,pages*g,0,run,0)); CK(cuMemSetAccess(rbase,pages*g,&a,1)); double map_run=us(t0);
  t0=clk::now(); CK(cuMemUnmap(rbase,pages*g)); CK(cuMemRelease(run)); double free_run=us(t0);
  CK(cuMemAddressFree(rbase,pages*g));
  // pages: one allocation each, mapped in order into one range, access set once
  std::vector<CUmemGenericAllocationHandle> h(pages);
  t0=clk::now(); for(int i=0;i<pages;i++) CK(cuMemCreate(&h[i],g,&p,0)); double create_pages=us(t0);
  CUdeviceptr base; CK(cuMemAddressReserve(&base,pages*g,0,0,0));
  t0=clk::now(); for(int i=0;i<pages;i++) CK(cuMemMap(base+i*g,g,0,h[i],0)); CK(cuMemSetAccess(base,pages*g,&a,1)); double map_pages=us(t0);
  CK(cuMemGetInfo(&f1,&t));
  printf("granularity %zu, %d pages (%zu MiB)\n", g, pages, pages*g>>20);
  printf("one run: create %.1f us, map+access %.1f us, unmap+release %.1f us\n", create_run, map_run, free_run);
  printf("pages: create %.1f us (%.2f a page), map+access %.1f us (%.2f a page); free memory fell %zu MiB\n",
         create_pages, create_pages/pages, map_pages, map_pages/pages, (f0-f1)>>20);
  // views: each maps `per` pages chosen at random, in random order
  std::mt19937 rng(7); std::vector<int> idx(pages); for(int i=0;i<pages;i++) idx[i]=i;
  std::vector<CUdeviceptr> vb(views);
  t0=clk::now();
  for(int v=0;v<views;v++){
    std::shuffle(idx.begin(),idx.end(),rng);
    CK(cuMemAddressReserve(&vb[v],per*g,0,0,0));
    for(int i=0;i<per;i++) CK(cuMemMap(vb[v]+i*g,g,0,h[idx[i]],0));
    CK(cuMemSetAccess(vb[v],per*g,&a,1));
  }
  double map_views=us(t0);
  CK(cuMemGetInfo(&f2,&t));
  printf("%d views of %d pages (%zu GiB of addresses): %.1f us (%.2f a page mapped, %.1f a view); free memory fell %zu MiB more\n",
         views, per, (size_t)views*per*g>>30, map_views, map_views/((double)views*per), map_views/views, (f1-f2)>>20);
  // a byte through the range, read through the last view at the page it maps
  CK(cuMemsetD8(base,0,pages*g));
  int pg=idx[3]; CK(cuMemsetD8(base+pg*g+5,42,1)); unsigned char b=0; CK(cuMemcpyDtoH(&b,vb[views-1]+3*g+5,1));
  printf("wrote 42 at page %d of the range, read %d through the last view's page 3\n", pg, b);
  // a kernel-free copy across two views of the same pages
  CK(cuMemcpyDtoD(vb[0], vb[1], g)); CK(cuCtxSynchronize());
  t0=clk::now();
  for(int v=0;v<views;v++){ CK(cuMemUnmap(vb[v],per*g)); CK(cuMemAddressFree(vb[v],per*g)); }
  double unmap_views=us(t0);
  CK(cuMemGetInfo(&f3,&t));
  printf("views unmapped: %.1f us (%.2f a page); free memory back to %zu MiB below the start\n", unmap_views, unmap_views/((double)views*per), (f0-f3)>>20);
  CK(cuMemUnmap(base,pages*g)); for(int i=0;i<pages;i++) CK(cuMemRelease(h[i])); CK(cuMemAddressFree(base,pages*g));
  return 0;
}
