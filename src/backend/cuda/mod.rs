//! The CUDA backend (cargo feature `cuda`): device memory from the driver API through `cudarc`,
//! loaded at run time.

pub(crate) mod moments;
mod virtual_memory;

use super::{Backend, RawEvent, RawStream, DEFAULT_PAGE_SIZE};
use crate::error::{BackendError, Error};
use crate::sync::Mutex;
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use virtual_memory::Pages;

thread_local! {
    static OWN_CALL: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is inside one of this backend's own segment calls: the observer
/// of CUDA allocations (`vramscope::observe`) leaves those out, since they are the caching
/// allocator's reserved memory, counted there.
#[cfg_attr(not(feature = "cupti"), allow(dead_code))]
pub(crate) fn in_own_call() -> bool {
    OWN_CALL.with(Cell::get)
}

/// What device `dev`'s default stream-ordered pool holds, as the driver counts it; `None` if
/// the driver cannot say (no pools on this device, or an error).
pub(crate) fn default_pool(dev: sys::CUdevice) -> Option<crate::backend::DriverPool> {
    use sys::CUmemPool_attribute as A;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out pointer; `dev` is a device handle of the driver.
    if unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, dev) } != sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    let read = |attr: A| {
        let mut v = 0u64;
        // SAFETY: these four attributes are 64-bit integers (cuuint64_t) written to `v`.
        let r = unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast()) };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
    };
    Some(crate::backend::DriverPool::new(
        read(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
        read(A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        read(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
        read(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
    ))
}

/// Marks the calling thread as inside a segment call of this backend until dropped.
struct OwnCall;

impl OwnCall {
    fn enter() -> OwnCall {
        OWN_CALL.with(|c| c.set(true));
        OwnCall
    }
}

impl Drop for OwnCall {
    fn drop(&mut self) {
        OWN_CALL.with(|c| c.set(false));
    }
}

/// The environment variable [`CudaBackend::new`] reads to choose [`CudaSegments`]: `virtual`
/// (the default where the device supports virtual memory management) or `malloc`.
pub const CUDA_SEGMENTS_ENV: &str = "VRAMSCOPE_CUDA_SEGMENTS";

/// Where the CUDA backend's segments come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CudaSegments {
    /// One `cuMemAlloc` per segment, freed whole with `cuMemFree` (which waits for the device).
    /// A segment cannot grow, and gives memory back only whole. [`CudaBackend::new`] falls back
    /// to these where the device has no virtual memory management.
    Malloc,
    /// Virtual memory, as PyTorch's expandable segments: each segment is an address range from
    /// `cuMemAddressReserve` backed by one `cuMemCreate` handle per granule
    /// ([`map_granule`](crate::backend::map_granule): a 2 MiB page, doubled while the segment
    /// holds 32, up to 64 MiB), so the allocator can give back the granules under free holes
    /// ([`Backend::can_unmap`]) and map them again later. A large segment reserves as many
    /// addresses as the device has memory, so that it can grow in place
    /// ([`Backend::reserve_growable`]). Reserving costs two driver calls per granule
    /// (PyTorch's expandable segments: per 2 MiB page); unmapping waits for the segment's
    /// stream, not the device.
    ///
    /// The default: of the twelve single-stream traces of `fixtures/torch` replayed on an H100,
    /// these reserve less at peak than `cuMemAlloc` segments on ten (1.014 against 1.106 on
    /// GPT-2 training, 1.153 against 1.412 on an encoder served at random shapes), as much on
    /// one, more on one (a network on random graphs, 1.149 against 1.111), and call the driver
    /// no more once warm; a first pass costs more driver calls (`BENCHMARKS.md`).
    #[default]
    Virtual,
}

impl CudaSegments {
    /// Reads [`CUDA_SEGMENTS_ENV`]: unset is the default, [`CudaSegments::Virtual`].
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var(CUDA_SEGMENTS_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(CudaSegments::default()),
            Ok(v) if v.eq_ignore_ascii_case("malloc") => Ok(CudaSegments::Malloc),
            Ok(v) if v.eq_ignore_ascii_case("virtual") => Ok(CudaSegments::Virtual),
            Ok(v) => Err(Error::Config {
                key: CUDA_SEGMENTS_ENV.into(),
                message: format!("`{v}` is not a kind of segments; accepted: malloc, virtual"),
            }),
            Err(_) => Err(Error::Config { key: CUDA_SEGMENTS_ENV.into(), message: "not valid UTF-8".into() }),
        }
    }
}

/// Device memory of one CUDA device, with its streams and events.
///
/// Segments come from `cuMemAlloc`, or from virtual memory ([`CudaSegments`]); streams are
/// `cudarc` [`CudaStream`]s (raw stream 0 is the context's default stream, the others are
/// non-blocking); cross-stream reuse waits on events recorded at free time and queried without
/// blocking, and a segment taken over by another stream orders that stream after an event on
/// the old one. Buffers are not host-addressable: their contents move with
/// [`Buffer::copy_from_host`](crate::Buffer::copy_from_host) and
/// [`Buffer::to_vec`](crate::Buffer::to_vec), which copy on the buffer's stream (after the work
/// queued there) and return when the copy is done.
///
/// ```no_run
/// # #[cfg(feature = "cuda-backend")] {
/// use vramscope::{CachingAllocator, backend::CudaBackend};
/// let alloc = CachingAllocator::new(CudaBackend::new(0)?);
/// let mut x = alloc.alloc::<f32>(&alloc.default_stream(), 1024)?;
/// x.copy_from_host(&vec![1.0; 1024])?;
/// # }
/// # Ok::<(), vramscope::Error>(())
/// ```
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    total: u64,
    streams: Mutex<Vec<Arc<CudaStream>>>,
    events: Mutex<(u64, HashMap<RawEvent, CudaEvent>)>,
    /// The page table of virtual-memory segments; `None` with `cuMemAlloc` segments.
    pages: Option<Mutex<Pages>>,
    page: u64,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ctx.ordinal())
            .field("total", &self.total)
            .field("segments", &self.segments())
            .finish()
    }
}

pub(super) fn driver(what: &str, e: DriverError) -> BackendError {
    if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
        BackendError::OutOfMemory { requested: 0, message: format!("{what}: {e}") }
    } else {
        BackendError::Other(format!("{what}: {e}"))
    }
}

/// Names the request an out-of-memory error from the driver was for (`driver` cannot know it).
fn for_request(e: BackendError, requested: u64) -> BackendError {
    match e {
        BackendError::OutOfMemory { message, .. } => BackendError::OutOfMemory { requested, message },
        other => other,
    }
}

/// Whether the CUDA driver library can be loaded, asked of the dynamic loader before `cudarc`
/// is: with cudarc's `dynamic-loading` (vramscope's choice where no crate chose a linking
/// mode) a missing library would be a panic inside cudarc; with `dynamic-linking` (candle's)
/// it is loaded already and this finds it.
pub(crate) fn driver_library_present() -> bool {
    #[cfg(unix)]
    {
        ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
            let name = std::ffi::CString::new(*name).expect("no NUL in the name");
            // SAFETY: `name` is a NUL-terminated string; loading the driver library runs its
            // initializers, as cudarc's own loading would; the handle is closed at once (the
            // library stays loaded while anything else holds it).
            unsafe {
                let handle = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
                if !handle.is_null() {
                    libc::dlclose(handle);
                }
                !handle.is_null()
            }
        })
    }
    #[cfg(not(unix))]
    {
        true
    }
}

impl CudaBackend {
    /// Opens device `ordinal` with the segments [`CUDA_SEGMENTS_ENV`] names. Unset, virtual
    /// ones where the device supports them and `cuMemAlloc` ones where it does not (or where
    /// setting them up fails); [`segments`](Self::segments) says which. A missing driver
    /// library or device is an error, not a panic (the library is looked for before `cudarc`
    /// is asked for a context).
    pub fn new(ordinal: usize) -> Result<Self, Error> {
        let chosen = std::env::var_os(CUDA_SEGMENTS_ENV).is_some();
        let segments = CudaSegments::from_env()?;
        match Self::with_segments(ordinal, segments) {
            // Unset, the kind is the default (virtual): fall back to `cuMemAlloc` segments.
            Err(_) if !chosen => Self::with_segments(ordinal, CudaSegments::Malloc),
            opened => opened,
        }
    }

    /// Opens device `ordinal` with the given kind of segments. [`CudaSegments::Virtual`] on a
    /// device without virtual memory management is an error.
    pub fn with_segments(ordinal: usize, segments: CudaSegments) -> Result<Self, Error> {
        if !driver_library_present() {
            return Err(Error::Backend(BackendError::Other(
                "the CUDA driver library (libcuda.so) was not found: install the NVIDIA driver, or use the host backend"
                    .into(),
            )));
        }
        // The ledger's baseline and context figure: read around the context's making, the one
        // moment they can be told apart from what the program allocates later.
        let fresh = moments::before_context(ordinal) && !moments::has_context(ordinal);
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| Error::Backend(BackendError::Other(format!("CUDA device {ordinal}: {e}"))))?;
        if fresh {
            moments::context_made(ordinal, "when vramscope's backend made it");
        }
        let (_, total) = ctx.mem_get_info().map_err(|e| Error::Backend(driver("cuMemGetInfo", e)))?;
        let default = ctx.default_stream();
        let pages = match segments {
            CudaSegments::Malloc => None,
            CudaSegments::Virtual => {
                let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
                if ctx.attribute(attr).unwrap_or(0) == 0 {
                    return Err(Error::Backend(BackendError::Unsupported(
                        "virtual memory management on this CUDA device",
                    )));
                }
                ctx.bind_to_thread().map_err(|e| Error::Backend(driver("binding the context", e)))?;
                Some(Mutex::new(Pages::new(ordinal as i32).map_err(Error::Backend)?))
            }
        };
        let page = pages.as_ref().map_or(DEFAULT_PAGE_SIZE, |p| p.lock().page);
        Ok(CudaBackend {
            ctx,
            total: total as u64,
            streams: Mutex::new(vec![default]),
            events: Mutex::new((0, HashMap::new())),
            pages,
            page,
        })
    }

    /// The kind of segments this backend hands out.
    pub fn segments(&self) -> CudaSegments {
        if self.pages.is_some() {
            CudaSegments::Virtual
        } else {
            CudaSegments::Malloc
        }
    }

    /// Waits for all work on the device: physical memory is unmapped or freed only after
    /// queued work that may still use it has finished (`cuMemFree` does this by itself).
    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.ctx.synchronize().map_err(|e| driver("cuCtxSynchronize", e))
    }

    /// The `cudarc` context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The `cudarc` stream behind a raw stream handle.
    pub fn stream(&self, raw: RawStream) -> Option<Arc<CudaStream>> {
        self.streams.lock().get(raw as usize).cloned()
    }

    /// Makes the context current on this thread, as driver calls other than cudarc's need.
    fn bind(&self) -> Result<(), BackendError> {
        self.ctx.bind_to_thread().map_err(|e| driver("binding the context", e))
    }

    fn stream_or_err(&self, raw: RawStream) -> Result<Arc<CudaStream>, BackendError> {
        self.stream(raw).ok_or_else(|| BackendError::Other(format!("unknown stream {raw}")))
    }
}

// SAFETY: segments come from `cuMemAlloc` or from reserved address ranges with physical pages
// mapped (`cuMemAddressReserve`, `cuMemMap`), disjoint and aligned to the page size; there is no
// host pointer; events and synchronization are CUDA's, which complete after the work queued
// before them.
unsafe impl Backend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }

    fn total_memory(&self) -> u64 {
        self.total
    }

    fn costly_segments(&self) -> bool {
        true
    }

    fn free_memory(&self) -> u64 {
        self.ctx.mem_get_info().map_or(0, |(free, _)| free as u64)
    }

    fn driver_pool(&self) -> Option<crate::backend::DriverPool> {
        self.bind().ok()?;
        default_pool(self.ctx.cu_device())
    }

    fn reserve(&self, size: u64) -> Result<u64, BackendError> {
        let bytes = usize::try_from(size).map_err(|_| BackendError::OutOfMemory {
            requested: size,
            message: "size exceeds the address space".into(),
        })?;
        self.bind()?;
        let _own = OwnCall::enter();
        let reserved = match &self.pages {
            Some(pages) => pages.lock().reserve(size, size),
            // SAFETY: the context is current on this thread (bound above); the memory is
            // returned with `release` exactly once, by the allocator.
            None => unsafe { result::malloc_sync(bytes) }.map_err(|e| driver("cuMemAlloc", e)),
        };
        reserved.map_err(|e| for_request(e, size))
    }

    fn reserve_growable(&self, size: u64, span: u64) -> Result<u64, BackendError> {
        let Some(pages) = &self.pages else { return Err(BackendError::Unsupported("growable cuMemAlloc segments")) };
        self.bind()?;
        let _own = OwnCall::enter();
        pages.lock().reserve(size, span).map_err(|e| for_request(e, size))
    }

    unsafe fn release(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        self.bind()?;
        let _own = OwnCall::enter();
        if let Some(pages) = &self.pages {
            self.synchronize_device()?;
            return pages.lock().release(addr, size);
        }
        // SAFETY: the caller promises a segment of ours (from `cuMemAlloc` in `reserve`), not
        // released before, that nothing uses any more.
        unsafe { result::free_sync(addr) }.map_err(|e| driver("cuMemFree", e))
    }

    fn page_size(&self) -> u64 {
        self.page
    }

    fn can_unmap(&self) -> bool {
        self.pages.is_some()
    }

    unsafe fn unmap(&self, addr: u64, len: u64, stream: RawStream) -> Result<(), BackendError> {
        let Some(pages) = &self.pages else { return Err(BackendError::Unsupported("unmap with cuMemAlloc segments")) };
        self.bind()?;
        // The observer leaves the allocator's own mappings out (its segments are counted once).
        let _own = OwnCall::enter();
        // A block the allocator considers free may still be read or written by work queued on
        // the stream that freed it (reuse on that stream is ordered; unmapping is not). Only
        // that stream is waited for: other streams' work (other users' too) goes on.
        self.synchronize(stream)?;
        pages.lock().unmap_range(addr, addr + len)
    }

    fn map(&self, addr: u64, len: u64) -> Result<(), BackendError> {
        let Some(pages) = &self.pages else { return Err(BackendError::Unsupported("map with cuMemAlloc segments")) };
        self.bind()?;
        let _own = OwnCall::enter();
        pages.lock().map(addr, len).map_err(|e| for_request(e, len))
    }

    fn can_alias(&self) -> bool {
        self.pages.is_some()
    }

    fn alias(&self, maps: &[u64]) -> Result<u64, BackendError> {
        let Some(table) = &self.pages else { return Err(BackendError::Unsupported("views with cuMemAlloc segments")) };
        self.bind()?;
        let _own = OwnCall::enter();
        table.lock().alias(maps)
    }

    unsafe fn unalias(&self, addr: u64, len: u64, stream: RawStream) -> Result<(), BackendError> {
        let Some(pages) = &self.pages else { return Err(BackendError::Unsupported("views with cuMemAlloc segments")) };
        self.bind()?;
        let _own = OwnCall::enter();
        // As for `unmap`: work the freeing stream queued may still use the view.
        self.synchronize(stream)?;
        pages.lock().unalias(addr, len)
    }

    fn create_stream(&self) -> Result<RawStream, BackendError> {
        let s = self.ctx.new_stream().map_err(|e| driver("cuStreamCreate", e))?;
        let mut streams = self.streams.lock();
        streams.push(s);
        Ok((streams.len() - 1) as RawStream)
    }

    fn record_event(&self, stream: RawStream) -> Result<RawEvent, BackendError> {
        let s = self.stream_or_err(stream)?;
        let ev = s.record_event(None).map_err(|e| driver("cuEventRecord", e))?;
        let mut events = self.events.lock();
        events.0 += 1;
        let id = events.0;
        events.1.insert(id, ev);
        Ok(id)
    }

    fn event_completed(&self, event: RawEvent) -> Result<bool, BackendError> {
        match self.events.lock().1.get(&event) {
            Some(ev) => ev.try_is_complete().map_err(|e| driver("cuEventQuery", e)),
            None => Ok(true),
        }
    }

    fn destroy_event(&self, event: RawEvent) {
        self.events.lock().1.remove(&event);
    }

    fn stream_idle(&self, stream: RawStream) -> Result<bool, BackendError> {
        let s = self.stream_or_err(stream)?;
        // SAFETY: `s` is a live stream of this context, kept alive by the `Arc` for the call;
        // `cuStreamQuery` only reads its state and does not block.
        match unsafe { sys::cuStreamQuery(s.cu_stream()) }.result() {
            Ok(()) => Ok(true),
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(e) => Err(driver("cuStreamQuery", e)),
        }
    }

    fn synchronize(&self, stream: RawStream) -> Result<(), BackendError> {
        self.stream_or_err(stream)?.synchronize().map_err(|e| driver("cuStreamSynchronize", e))
    }

    fn order_after(&self, waiting: RawStream, on: RawStream) -> Result<(), BackendError> {
        let (w, o) = (self.stream_or_err(waiting)?, self.stream_or_err(on)?);
        // An event recorded on `on` now, which `waiting` waits for: stream-ordered, the host
        // goes on at once. Copies run on their buffer's stream (below), so they wait too.
        w.join(&o).map_err(|e| driver("cuEventRecord + cuStreamWaitEvent", e))
    }

    fn cuda_stream(&self, stream: RawStream) -> Option<Arc<CudaStream>> {
        self.stream(stream)
    }

    // Copies go on the buffer's own stream, then wait for it: `cuMemcpyHtoD` and
    // `cuMemcpyDtoH` run on the legacy default stream, which does not wait for the
    // non-blocking streams that `create_stream` makes, so a copy into a block reused on its
    // stream could land before (and be overwritten by) the previous owner's kernel, and a copy
    // out could read before the buffer's own kernel wrote.

    fn copy_to_device(&self, stream: RawStream, addr: u64, src: &[u8]) -> Result<(), BackendError> {
        let s = self.stream_or_err(stream)?;
        self.bind()?;
        // SAFETY: the caller (a `Buffer`) owns `[addr, addr + src.len())`; `src` outlives the
        // copy, which is complete once the stream is synchronized below (or, if that fails, the
        // context is unusable and the copy never runs).
        unsafe { result::memcpy_htod_async(addr, src, s.cu_stream()) }.map_err(|e| driver("cuMemcpyHtoDAsync", e))?;
        s.synchronize().map_err(|e| driver("cuStreamSynchronize", e))
    }

    fn copy_from_device(&self, stream: RawStream, addr: u64, dst: &mut [u8]) -> Result<(), BackendError> {
        let s = self.stream_or_err(stream)?;
        self.bind()?;
        // SAFETY: the caller (a `Buffer`) owns `[addr, addr + dst.len())`; `dst` is borrowed
        // until the stream is synchronized below, when the copy is complete.
        unsafe { result::memcpy_dtoh_async(dst, addr, s.cu_stream()) }.map_err(|e| driver("cuMemcpyDtoHAsync", e))?;
        s.synchronize().map_err(|e| driver("cuStreamSynchronize", e))
    }
}
