"""What NVML says about this process, step by step, beside the CUDA driver's and PyTorch's
own counts: the recorded answers the ledger's tests replay, and the probe that says which
source the ledger can use on a machine (NVML's per-process figure, or the device's used
memory less a baseline).

    python3 tools/nvml_probe.py OUT.json

Steps: before any CUDA context; a bare primary context (driver API through ctypes); PyTorch
allocating 1 GiB; a cuBLAS matmul (its workspace); freeing; `empty_cache()`; a
`cudaMallocAsync` pool allocation freed (held by the pool). NVML is read through ctypes.
"""
import ctypes, json, os, sys

nvml = ctypes.CDLL("libnvidia-ml.so.1")
cuda = ctypes.CDLL("libcuda.so.1")


class MemInfo(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class ProcInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def check(r, what):
    if r != 0:
        raise RuntimeError(f"{what} returned {r}")


check(nvml.nvmlInit_v2(), "nvmlInit_v2")
count = ctypes.c_uint()
check(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), "count")
handles = []
for i in range(count.value):
    h = ctypes.c_void_p()
    check(nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)), "handle")
    handles.append(h)


def device_info(h):
    uuid = ctypes.create_string_buffer(96)
    nvml.nvmlDeviceGetUUID(h, uuid, 96)
    m = MemInfo()
    check(nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)), "memory info")
    n = ctypes.c_uint(64)
    procs = (ProcInfo * 64)()
    r = nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), procs)
    plist = [{"pid": procs[i].pid, "used": procs[i].usedGpuMemory} for i in range(n.value)] if r == 0 else None
    return {"uuid": uuid.value.decode(), "total": m.total, "free": m.free, "used": m.used,
            "processes": plist, "processes_result": r}


steps = []


def step(name, **extra):
    d = {"step": name, "pid": os.getpid(), "devices": [device_info(h) for h in handles]}
    d.update(extra)
    steps.append(d)
    print(name, json.dumps(d["devices"][0]), extra, flush=True)


step("no context")
check(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
check(cuda.cuCtxSetCurrent(ctx), "set current")
limits = {}
for name, code in [("stack", 0), ("printf_fifo", 1), ("malloc_heap", 2)]:
    v = ctypes.c_size_t()
    cuda.cuCtxGetLimit(ctypes.byref(v), code)
    limits[name] = v.value
free, total = ctypes.c_size_t(), ctypes.c_size_t()
cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
step("primary context", limits=limits, cu_free=free.value, cu_total=total.value)

import torch  # noqa: E402

x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
step("torch 1 GiB", allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved())
a = torch.randn(4096, 4096, device="cuda")
b = a @ a
torch.cuda.synchronize()
step("cublas matmul", allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved())
del x, b
step("freed", allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved())
torch.cuda.empty_cache()
step("empty_cache", allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved())
rt = ctypes.CDLL("libcudart.so.13") if os.path.exists("/usr/local/cuda/lib64/libcudart.so.13") else None
if rt is not None:
    p = ctypes.c_void_p()
    s = torch.cuda.current_stream().cuda_stream
    check(rt.cudaMallocAsync(ctypes.byref(p), ctypes.c_size_t(256 << 20), ctypes.c_void_p(s)), "cudaMallocAsync")
    check(rt.cudaFreeAsync(p, ctypes.c_void_p(s)), "cudaFreeAsync")
    torch.cuda.synchronize()
    step("pool 256 MiB freed, held")
json.dump({"machine": torch.cuda.get_device_name(0), "driver": torch.version.cuda, "steps": steps},
          open(sys.argv[1], "w"), indent=1)
