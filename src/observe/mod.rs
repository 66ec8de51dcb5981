//! Every CUDA allocation of the process, observed: cudarc's `CudaStream::alloc` and
//! `clone_htod`, candle's CUDA tensors, cuBLAS workspaces, any code that allocates through the
//! CUDA driver, recorded as the caching allocator records its own blocks (stack, scope, step,
//! thread, stream, size, address), so that [`#[gpu_mem_test]`](crate::gpu_mem_test), snapshots
//! and every report see that memory too. (Cargo feature `cupti`.)
//!
//! [`start`] subscribes to CUPTI's callbacks for the driver's allocation calls (`cuMemAlloc_v2`,
//! `cuMemAllocPitch_v2`, `cuMemAllocManaged`, `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`
//! and their per-thread-stream `_ptsz` variants) and frees (`cuMemFree_v2`, `cuMemFreeAsync`,
//! `_ptsz`), and the virtual-memory calls that map and unmap (`cuMemMap`, `cuMemUnmap`). CUPTI
//! calls back on the allocating thread, after the call returned; a call that
//! failed records nothing. Each device's observed memory lives in an allocator of its own,
//! [`allocator`]`(device)` (backend `cuda (observed)`), made by
//! [`CachingAllocator::external`]: one segment per allocation, whose one block is allocated.
//!
//! - Memory freed stream-ordered (`cuMemFreeAsync`) counts as freed when the free is called,
//!   not when the stream reaches it.
//! - The caching allocator's own segment calls (its `cuMemAlloc` and `cuMemFree`) are left out:
//!   they are its reserved memory, counted there, so each byte counts once.
//! - Virtual memory counts where it is mapped: a `cuMemMap` records the range mapped, with the
//!   mapping call's stack, and a `cuMemUnmap` forgets every mapping recorded inside the range
//!   it unmaps. Creating and releasing physical memory (`cuMemCreate`, `cuMemRelease`) is not
//!   counted apart: memory created but never mapped is not seen, and a handle mapped at two
//!   addresses counts at both. Mapped ranges are what the program's pointers reach, and what
//!   PyTorch's expandable segments count as reserved.
//! - Snapshots of an observed device carry its stream-ordered pool as the driver counts it
//!   ([`Snapshot::driver_pool`](crate::Snapshot::driver_pool)): what cudarc's and candle's
//!   freed allocations left cached there, as PyTorch's reserved memory.
//! - Memory allocated before [`start`] is not seen; its frees are ignored. [`pause`] and
//!   [`resume`] turn CUPTI's callbacks off and on (nothing is seen meanwhile, frees included).
//! - Observing costs 1.5–1.6 times a cudarc `alloc` + drop pair (about 1.3–2.8 µs unobserved on
//!   an H100 host), at one site and over 1,000 distinct stacks (`benches/observe.rs`, which
//!   times the pair paused and observed in turn; BENCHMARKS.md).
//! - The runtime API is seen through the driver calls it makes: `cudaMalloc` and `cudaFree`
//!   call back as `cuMemAlloc_v2` and `cuMemFree_v2`, `cudaMallocAsync` and `cudaFreeAsync` as
//!   `cuMemAllocAsync` and `cuMemFreeAsync`, once each (checked on an H100 with CUDA 13 by
//!   `tests/gpu/cupti_runtime.cpp`), so PyTorch-style runtime users are observed too.
//!
//! CUPTI is loaded at run time (`libcupti.so`; see [`start`] for where it is looked for):
//! without it, or without a CUDA driver, [`start`] is an error saying so.

mod cupti;

use crate::alloc::heap::Made;
use crate::error::{BackendError, Error, Result};
use crate::CachingAllocator;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

/// Frames kept per observed allocation: CUPTI's, the driver's, cudarc's and vramscope's own take
/// about 13 of them below the program's (measured on an H100), so the default 32 would leave
/// the program 19; 64 leaves it about 50. (`observe::allocator(n).record_memory_history(...)`
/// changes it.)
pub const OBSERVED_STACK_DEPTH: usize = 64;

/// The process's observer: CUPTI, subscribed, or why not.
static OBSERVER: OnceLock<std::result::Result<String, String>> = OnceLock::new();

/// CUPTI and the subscriber, once subscribed: loaded for the life of the process (the
/// subscription is never removed).
static SUBSCRIBED: OnceLock<Subscribed> = OnceLock::new();

struct Subscribed {
    cupti: cupti::Cupti,
    subscriber: usize,
}

/// The allocators of observed memory, by device.
fn allocators() -> &'static Mutex<BTreeMap<usize, CachingAllocator>> {
    static ALLOCATORS: OnceLock<Mutex<BTreeMap<usize, CachingAllocator>>> = OnceLock::new();
    ALLOCATORS.get_or_init(Mutex::default)
}

/// Starts observing every CUDA allocation of the process (once; later calls return what the
/// first did). Returns where CUPTI was loaded from.
///
/// CUPTI is looked for at `VRAMSCOPE_CUPTI` (a path), on the loader's path (`libcupti.so`,
/// `.so.13`, `.so.12`), then in the CUDA toolkit (`$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda*`,
/// under `extras/CUPTI/lib64`). An error says why observing cannot start: no CUPTI, or another
/// CUPTI subscriber in the process (a profiler: CUPTI allows one).
pub fn start() -> Result<String> {
    OBSERVER
        .get_or_init(|| {
            let cupti = cupti::Cupti::load()?;
            // The ledger's baselines: each device's used memory while this process has no
            // context there, read before the subscription so that the contexts made from now
            // on are measured when CUPTI reports them.
            for d in 0..device_count() {
                crate::backend::cuda::moments::before_context(d);
            }
            let subscriber = cupti.subscribe(callback, &cupti::cbid::ALL)?;
            let resources = [
                cupti::RESOURCE_CONTEXT_CREATED,
                cupti::RESOURCE_MODULE_LOADED,
                cupti::RESOURCE_MODULE_UNLOAD_STARTING,
            ];
            // Without them the ledger cannot measure contexts and modules; allocations are
            // still observed.
            let _ = cupti.enable_in(subscriber, cupti::DOMAIN_RESOURCE, &resources, true);
            let subscriber = subscriber as usize;
            let path = cupti.path.clone();
            let _ = SUBSCRIBED.set(Subscribed { cupti, subscriber });
            Ok(path)
        })
        .clone()
        .map_err(|m| Error::Backend(BackendError::Other(m)))
}

/// Whether [`start`] succeeded.
pub fn is_running() -> bool {
    matches!(OBSERVER.get(), Some(Ok(_)))
}

/// Stops observing until [`resume`]: CUPTI stops calling back, so the driver's calls cost
/// what they cost unobserved (this is how `benches/observe.rs` measures both in turn, in one
/// process). Nothing is recorded meanwhile, frees included: an allocation observed before and
/// freed while paused stays recorded as live until its address is allocated again under
/// observation. An error where observing never started.
pub fn pause() -> Result<()> {
    switch(false)
}

/// Observes again after [`pause`]. An error where observing never started.
pub fn resume() -> Result<()> {
    switch(true)
}

fn switch(on: bool) -> Result<()> {
    let s = SUBSCRIBED
        .get()
        .ok_or_else(|| Error::Backend(BackendError::Other("observing CUDA allocations was not started".into())))?;
    s.cupti
        .enable(s.subscriber as *mut c_void, &cupti::cbid::ALL, on)
        .map_err(|m| Error::Backend(BackendError::Other(m)))
}

/// The allocator holding device `device`'s observed memory (made at the first allocation seen
/// there), if any.
pub fn allocator(device: usize) -> Option<CachingAllocator> {
    allocators().lock().unwrap_or_else(|e| e.into_inner()).get(&device).cloned()
}

/// By (context, module id): (device, cubin bytes).
type Modules = BTreeMap<(usize, u32), (usize, u64)>;

/// Modules loaded, by context and module id: the device and the cubin's bytes, for modules
/// the ledger counts (those loaded after the device's context was measured, or on a device
/// whose context was never measured).
fn modules() -> &'static Mutex<Modules> {
    static MODULES: OnceLock<Mutex<Modules>> = OnceLock::new();
    MODULES.get_or_init(Mutex::default)
}

/// Bytes of the cubins of the modules loaded on `device` that the ledger counts, where the
/// observer is subscribed to module loads (`None` where it is not running).
pub(crate) fn module_bytes(device: usize) -> Option<u64> {
    if !is_running() {
        return None;
    }
    let m = modules().lock().unwrap_or_else(|e| e.into_inner());
    Some(m.values().filter(|(d, _)| *d == device).map(|(_, b)| *b).sum())
}

/// CUDA devices the driver lists (0 without a driver).
fn device_count() -> usize {
    let mut n = 0;
    // SAFETY: `cuInit` has no preconditions; `n` is a valid out pointer.
    let ok = unsafe {
        cudarc::driver::sys::cuInit(0) == cudarc::driver::sys::CUresult::CUDA_SUCCESS
            && cudarc::driver::sys::cuDeviceGetCount(&mut n) == cudarc::driver::sys::CUresult::CUDA_SUCCESS
    };
    if ok {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

/// The device of `context`, which need not be current.
fn device_of(context: *mut c_void) -> Option<usize> {
    use cudarc::driver::sys;
    let mut dev = 0;
    // SAFETY: `context` is a context CUPTI reported; pushed and popped around the query so the
    // thread's current context is left as it was.
    unsafe {
        if sys::cuCtxPushCurrent_v2(context.cast()) != sys::CUresult::CUDA_SUCCESS {
            return None;
        }
        let r = sys::cuCtxGetDevice(&mut dev);
        let mut popped = std::ptr::null_mut();
        let _ = sys::cuCtxPopCurrent_v2(&mut popped);
        if r != sys::CUresult::CUDA_SUCCESS {
            return None;
        }
    }
    usize::try_from(dev).ok()
}

/// The module a module callback names: (context, module id), and its cubin's bytes.
///
/// # Safety
///
/// `data` is the `CUpti_ResourceData` of a module callback (loaded or unloading).
unsafe fn module_of(data: &cupti::ResourceData) -> Option<((usize, u32), u64)> {
    if data.resource_descriptor.is_null() {
        return None;
    }
    // SAFETY: for module callbacks the descriptor is a `CUpti_ModuleResourceData`.
    let m = unsafe { &*(data.resource_descriptor as *const cupti::ModuleResourceData) };
    Some(((data.context as usize, m.module_id), m.cubin_size as u64))
}

/// A resource callback: a context made (measured for the ledger), a module loaded or about to
/// be unloaded (its cubin's bytes counted or forgotten).
///
/// # Safety
///
/// `data` is the `CUpti_ResourceData` CUPTI passes for resource callback `cbid`.
unsafe fn resource(cbid: u32, data: *const cupti::ResourceData) {
    use crate::backend::cuda::moments;
    // SAFETY: per this function's contract.
    let data = unsafe { &*data };
    let Some(device) = device_of(data.context) else { return };
    match cbid {
        cupti::RESOURCE_CONTEXT_CREATED => {
            moments::context_made(device, "when CUPTI saw it made");
        }
        cupti::RESOURCE_MODULE_LOADED | cupti::RESOURCE_MODULE_UNLOAD_STARTING => {
            // SAFETY: a module callback's data, per this function's contract.
            let Some((key, cubin)) = (unsafe { module_of(data) }) else { return };
            let mut all = modules().lock().unwrap_or_else(|e| e.into_inner());
            if cbid == cupti::RESOURCE_MODULE_UNLOAD_STARTING {
                all.remove(&key);
                return;
            }
            // Modules loaded while a measured context was being made are inside its figure.
            let measured = moments::context(device).is_some();
            if measured || moments::baseline(device).is_none() {
                all.insert(key, (device, cubin));
            }
        }
        _ => {}
    }
}

thread_local! {
    /// The context of this thread's last observed call and its device's allocator: a thread
    /// usually stays on one context, so the usual callback asks the driver nothing and takes
    /// no global lock.
    static LAST: std::cell::RefCell<Option<(usize, CachingAllocator)>> = const { std::cell::RefCell::new(None) };
}

/// The allocator of the device of `context` (the current context, inside a callback).
fn allocator_for(context: *mut c_void) -> Option<CachingAllocator> {
    let key = context as usize;
    let cached = LAST.try_with(|last| match &*last.borrow() {
        Some((k, a)) if *k == key && key != 0 => Some(a.clone()),
        _ => None,
    });
    if let Ok(Some(a)) = cached {
        return Some(a);
    }
    let a = allocator_here()?;
    let _ = LAST.try_with(|last| *last.borrow_mut() = Some((key, a.clone())));
    Some(a)
}

/// The allocator of the current context's device, made on first use.
fn allocator_here() -> Option<CachingAllocator> {
    let mut dev = 0;
    // SAFETY: `dev` is a valid out pointer; inside a driver callback a context is current.
    let r = unsafe { cudarc::driver::sys::cuCtxGetDevice(&mut dev) };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    let device = usize::try_from(dev).ok()?;
    let mut all = allocators().lock().unwrap_or_else(|e| e.into_inner());
    Some(
        all.entry(device)
            .or_insert_with(|| {
                let mut total = 0usize;
                // SAFETY: `total` is a valid out pointer; `dev` is a device handle from above.
                let _ = unsafe { cudarc::driver::sys::cuDeviceTotalMem_v2(&mut total, dev) };
                let backend = crate::backend::ExternalBackend::new(crate::backend::OBSERVED_BACKEND, total as u64)
                    .with_driver_pool(move || crate::backend::cuda::default_pool(dev));
                let a = CachingAllocator::external_on(backend, device);
                a.record_memory_history(crate::record::RecordConfig {
                    max_depth: OBSERVED_STACK_DEPTH,
                    ..crate::record::RecordConfig::default()
                });
                a
            })
            .clone(),
    )
}

/// What a callback saw: an allocation (address, bytes, stream), a free (address), or an
/// unmapped range (address, bytes).
enum Seen {
    Alloc(u64, u64, u64, Made),
    Free(u64),
    Unmap(u64, u64),
}

/// Reads a call's parameters, after it returned successfully.
///
/// # Safety
///
/// `params` is the parameter structure CUPTI passes for driver call `cbid`, at the exit site.
unsafe fn seen(cbid: u32, params: *const c_void) -> Option<Seen> {
    use cupti::cbid::*;
    use cupti::*;
    // SAFETY (every read below): CUPTI passes the call's parameters with the layout of
    // `generated_cuda_meta.h` for `cbid`; at the exit site the out pointers were written by
    // the call, which succeeded.
    unsafe {
        Some(match cbid {
            MEM_ALLOC_V2 | MEM_ALLOC_MANAGED => {
                let p = &*(params as *const MemAllocParams);
                Seen::Alloc(*p.dptr, p.bytesize as u64, 0, Made::Allocated)
            }
            MEM_ALLOC_PITCH_V2 => {
                let p = &*(params as *const MemAllocPitchParams);
                Seen::Alloc(*p.dptr, (*p.pitch as u64).saturating_mul(p.height as u64), 0, Made::Allocated)
            }
            MEM_ALLOC_ASYNC | MEM_ALLOC_ASYNC_PTSZ => {
                let p = &*(params as *const MemAllocAsyncParams);
                Seen::Alloc(*p.dptr, p.bytesize as u64, p.stream as u64, Made::Pooled)
            }
            MEM_ALLOC_FROM_POOL_ASYNC | MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => {
                let p = &*(params as *const MemAllocFromPoolAsyncParams);
                Seen::Alloc(*p.dptr, p.bytesize as u64, p.stream as u64, Made::Pooled)
            }
            MEM_MAP => {
                let p = &*(params as *const MemMapParams);
                Seen::Alloc(p.ptr, p.size as u64, 0, Made::Mapped)
            }
            MEM_UNMAP => {
                let p = &*(params as *const MemUnmapParams);
                Seen::Unmap(p.ptr, p.size as u64)
            }
            MEM_FREE_V2 => Seen::Free((*(params as *const MemFreeParams)).dptr),
            MEM_FREE_ASYNC | MEM_FREE_ASYNC_PTSZ => Seen::Free((*(params as *const MemFreeAsyncParams)).dptr),
            _ => return None,
        })
    }
}

/// CUPTI's callback, on the thread that made the call.
unsafe extern "C" fn callback(_userdata: *mut c_void, domain: i32, cbid: u32, data: *const cupti::CallbackData) {
    if domain == cupti::DOMAIN_RESOURCE && !data.is_null() {
        // SAFETY: in the resource domain CUPTI passes a `CUpti_ResourceData`.
        let _ = std::panic::catch_unwind(|| unsafe { resource(cbid, data.cast()) });
        return;
    }
    if domain != cupti::DOMAIN_DRIVER_API || data.is_null() || crate::backend::cuda::in_own_call() {
        return;
    }
    // Never unwind into CUPTI's C frames.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: CUPTI passes valid callback data for the call being made.
        let data = unsafe { &*data };
        if data.callback_site != cupti::API_EXIT || data.function_params.is_null() {
            return;
        }
        // SAFETY: at the exit site of a driver call the return value is that call's `CUresult`.
        let ok = data.function_return_value.is_null() || unsafe { *(data.function_return_value as *const i32) } == 0;
        if !ok {
            return;
        }
        // SAFETY: the parameters of driver call `cbid`, at its exit site.
        let Some(seen) = (unsafe { seen(cbid, data.function_params) }) else { return };
        let Some(alloc) = allocator_for(data.context) else { return };
        match seen {
            Seen::Alloc(addr, bytes, stream, made) if bytes > 0 => {
                let _ = alloc.record_made(stream, addr, bytes, made);
            }
            Seen::Free(addr) => {
                alloc.forget_external(addr);
            }
            Seen::Unmap(addr, bytes) => {
                alloc.forget_external_range(addr, bytes);
            }
            Seen::Alloc(..) => {}
        }
    });
}

#[cfg(test)]
mod tests {
    use super::cupti::*;
    use super::*;

    fn alloc_of(cbid: u32, params: *const c_void) -> Option<(u64, u64, u64)> {
        // SAFETY: each test passes the parameter structure of `cbid`.
        match unsafe { seen(cbid, params) } {
            Some(Seen::Alloc(a, b, s, _)) => Some((a, b, s)),
            _ => None,
        }
    }

    /// Callback records decoded without CUPTI: each call's parameters as the driver passes
    /// them, the out pointer written as the call would.
    #[test]
    fn every_observed_call_decodes() {
        let mut out = 0x7f00_0000_1000u64;
        let p = MemAllocParams { dptr: &mut out, bytesize: 1000 };
        assert_eq!(alloc_of(cbid::MEM_ALLOC_V2, (&p as *const MemAllocParams).cast()), Some((out, 1000, 0)));
        assert_eq!(alloc_of(cbid::MEM_ALLOC_MANAGED, (&p as *const MemAllocParams).cast()), Some((out, 1000, 0)));
        let mut pitch = 1024usize;
        let p = MemAllocPitchParams {
            dptr: &mut out,
            pitch: &mut pitch,
            width_in_bytes: 1000,
            height: 3,
            element_size_bytes: 4,
        };
        assert_eq!(alloc_of(cbid::MEM_ALLOC_PITCH_V2, (&p as *const MemAllocPitchParams).cast()), Some((out, 3072, 0)));
        let stream = 0x55 as *mut c_void;
        let p = MemAllocAsyncParams { dptr: &mut out, bytesize: 512, stream };
        for id in [cbid::MEM_ALLOC_ASYNC, cbid::MEM_ALLOC_ASYNC_PTSZ] {
            assert_eq!(alloc_of(id, (&p as *const MemAllocAsyncParams).cast()), Some((out, 512, 0x55)));
        }
        let p = MemAllocFromPoolAsyncParams { dptr: &mut out, bytesize: 64, pool: std::ptr::null_mut(), stream };
        for id in [cbid::MEM_ALLOC_FROM_POOL_ASYNC, cbid::MEM_ALLOC_FROM_POOL_ASYNC_PTSZ] {
            assert_eq!(alloc_of(id, (&p as *const MemAllocFromPoolAsyncParams).cast()), Some((out, 64, 0x55)));
        }
        let p = MemFreeParams { dptr: out };
        // SAFETY: the parameters of `cuMemFree_v2`.
        assert!(
            matches!(unsafe { seen(cbid::MEM_FREE_V2, (&p as *const MemFreeParams).cast()) }, Some(Seen::Free(a)) if a == out)
        );
        let p = MemFreeAsyncParams { dptr: out, stream };
        for id in [cbid::MEM_FREE_ASYNC, cbid::MEM_FREE_ASYNC_PTSZ] {
            // SAFETY: the parameters of `cuMemFreeAsync`.
            assert!(
                matches!(unsafe { seen(id, (&p as *const MemFreeAsyncParams).cast()) }, Some(Seen::Free(a)) if a == out)
            );
        }
        let p = MemMapParams { ptr: out, size: 4 << 20, offset: 0, handle: 0x1234, flags: 0 };
        assert_eq!(alloc_of(cbid::MEM_MAP, (&p as *const MemMapParams).cast()), Some((out, 4 << 20, 0)));
        let p = MemUnmapParams { ptr: out, size: 8 << 20 };
        // SAFETY: the parameters of `cuMemUnmap`.
        assert!(matches!(
            unsafe { seen(cbid::MEM_UNMAP, (&p as *const MemUnmapParams).cast()) },
            Some(Seen::Unmap(a, 0x80_0000)) if a == out
        ));
        // SAFETY: an unknown call is not read.
        assert!(unsafe { seen(1, std::ptr::null()) }.is_none());
        assert_eq!(cbid::ALL.len(), 12);
    }

    /// A module callback's data decoded as CUPTI lays it out (`cupti_callbacks.h`).
    #[test]
    fn module_callbacks_decode() {
        assert_eq!(std::mem::size_of::<ResourceData>(), 24);
        assert_eq!(std::mem::size_of::<ModuleResourceData>(), 24);
        let mut module = ModuleResourceData { module_id: 42, cubin_size: 6_216, cubin: std::ptr::null() };
        let data = ResourceData {
            context: 0x1000 as *mut c_void,
            resource_handle: std::ptr::null_mut(),
            resource_descriptor: (&mut module as *mut ModuleResourceData).cast(),
        };
        // SAFETY: a module callback's data, built above.
        assert_eq!(unsafe { module_of(&data) }, Some(((0x1000, 42), 6_216)));
        let empty = ResourceData { resource_descriptor: std::ptr::null_mut(), ..data };
        // SAFETY: as above, without a descriptor.
        assert_eq!(unsafe { module_of(&empty) }, None);
    }

    #[test]
    fn without_cupti_starting_is_an_error_that_says_where_it_looked() {
        if std::env::var_os("VRAMSCOPE_CUPTI").is_some() || cupti::Cupti::load().is_ok() {
            return; // a machine with CUPTI: nothing to check here
        }
        let e = start().unwrap_err().to_string();
        assert!(e.contains("CUPTI (libcupti.so) was not found") && e.contains("VRAMSCOPE_CUPTI"), "{e}");
        assert!(!is_running());
        for e in [pause().unwrap_err(), resume().unwrap_err()] {
            assert!(e.to_string().contains("was not started"), "{e}");
        }
    }
}
