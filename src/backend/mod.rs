//! Where device memory comes from.
//!
//! A [`Backend`] hands out *segments* (large, page-aligned ranges of device memory), creates
//! streams and records events on them. The [`CachingAllocator`](crate::CachingAllocator) does
//! everything else. Three backends are real and one wraps the others:
//!
//! - [`HostBackend`]: host memory standing in for a device, with a capacity limit;
//! - [`SimBackend`]: address space only, any capacity, no memory behind it, for replaying traces
//!   of any size and for benchmarking the allocator alone;
//! - [`FaultyBackend`]: wraps another backend and fails chosen segment requests.

#[cfg(feature = "cuda-backend")]
pub(crate) mod cuda;
mod external;
mod faulty;
mod host;
mod sim;
mod views;

/// The backend name of the allocator holding the CUDA allocations `vramscope::observe` sees.
pub const OBSERVED_BACKEND: &str = "cuda (observed)";

#[cfg(feature = "cuda-backend")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda-backend")))]
pub use cuda::{CudaBackend, CudaSegments, CUDA_SEGMENTS_ENV};
pub use external::ExternalBackend;
pub use faulty::{FaultPlan, FaultyBackend};
pub use host::HostBackend;
pub use sim::{EventMode, SimBackend};

use crate::error::BackendError;
use std::fmt;
use std::sync::Arc;

/// The granularity in which segments are sized and pages are mapped: 2 MiB, as on CUDA.
pub const DEFAULT_PAGE_SIZE: u64 = 2 << 20;

/// The most bytes one mapping of a backend that can unmap holds (see [`map_granule`]).
pub const MAX_MAP_GRANULE: u64 = 64 << 20;

/// The granule in which a backend that can unmap maps a segment of `size` bytes, given its
/// page size: the page doubled while the segment still holds 32 granules, up to
/// [`MAX_MAP_GRANULE`] (a 20 MiB segment maps page by page, one of 1 GiB in 32 MiB granules,
/// one of 8 GiB in 64 MiB granules). Granules are counted from the segment's base; the last
/// one is shorter where the size is not a multiple.
///
/// Each granule is one mapping of its own (on CUDA one `cuMemCreate` and one `cuMemMap`, about
/// 60 µs whatever the size, against 45 µs for every 2 MiB page mapped alone, measured on an
/// H100 by `tests/gpu/vmm_costs.cpp`), and the unit that [`Backend::unmap`] gives back: a
/// mapping cannot be unmapped in part. Up to 32 granules keep a large hole's memory mostly
/// returnable while a segment of gigabytes maps in a few dozen calls instead of a thousand.
///
/// ```
/// use vramscope::backend::{map_granule, DEFAULT_PAGE_SIZE};
/// assert_eq!(map_granule(20 << 20, DEFAULT_PAGE_SIZE), 2 << 20);
/// assert_eq!(map_granule(1 << 30, DEFAULT_PAGE_SIZE), 32 << 20);
/// assert_eq!(map_granule(8 << 30, DEFAULT_PAGE_SIZE), 64 << 20);
/// ```
pub const fn map_granule(size: u64, page: u64) -> u64 {
    let mut g = page;
    while g <= MAX_MAP_GRANULE / 2 && g.saturating_mul(2 * 32) <= size {
        g *= 2;
    }
    g
}

/// The mappings a range of `size` bytes is made of: pieces of its [`map_granule`] (offset from
/// the range's start, length), the last shorter where `size` is not a multiple. The backends
/// map a segment they reserve this way and the allocator maps a growth this way, so that both
/// know where every mapping starts and ends.
pub(crate) fn granule_pieces(size: u64, page: u64) -> impl Iterator<Item = (u64, u64)> {
    let g = map_granule(size, page);
    (0..size.div_ceil(g)).map(move |k| (k * g, g.min(size - k * g)))
}

/// Whether `maps` (address and length, ascending) cover `[addr, end)` exactly: the first
/// starts at `addr`, each where the one before ends, the last ends at `end`.
pub(crate) fn tiles(maps: impl IntoIterator<Item = (u64, u64)>, addr: u64, end: u64) -> bool {
    let mut at = addr;
    for (a, l) in maps {
        if a != at {
            return false;
        }
        at = a + l;
    }
    at == end && end > addr
}

/// A raw stream handle as a backend knows it. `0` is the backend's default stream.
pub type RawStream = u64;

/// A raw event handle as a backend knows it.
pub type RawEvent = u64;

/// A source of device memory, streams and events.
///
/// Implementations must be `Send + Sync`: the allocator calls them from whichever thread is
/// allocating, while holding its own lock (so calls for one allocator never overlap).
///
/// Addresses are plain `u64` device addresses. Segments are reserved in multiples of
/// [`page_size`](Backend::page_size) and returned whole with [`release`](Backend::release).
/// Backends that can map and unmap physical pages inside a reserved range (virtual memory
/// management, as CUDA's `cuMemMap`) say so with [`can_unmap`](Backend::can_unmap); the
/// allocator then gives back the pages under large free holes instead of growing.
///
/// # Safety
///
/// The allocator hands memory to safe code ([`Buffer::as_host_slice`](crate::Buffer::as_host_slice),
/// reuse across streams) on the strength of what the backend says, so implementors promise,
/// as for [`GlobalAlloc`](std::alloc::GlobalAlloc):
///
/// - [`reserve`](Backend::reserve) returns the base of `size` bytes of address space aligned to
///   [`page_size`](Backend::page_size) (at least 512), overlapping no other segment not yet
///   released, usable until [`release`](Backend::release)d.
/// - [`host_ptr`](Backend::host_ptr), where it returns `Some(p)` for an address inside a
///   reserved, mapped segment, gives a pointer valid for reads and writes of the rest of that
///   segment until it is released or the page unmapped, to initialized bytes, aligned as the
///   device address is (modulo 512), and not reachable by the backend's other segments.
/// - An event that [`event_completed`](Backend::event_completed) reports done, and a
///   [`synchronize`](Backend::synchronize) that returns `Ok`, mean that every piece of work
///   queued on the stream before the event (or the call) has finished touching memory: the
///   allocator then hands that memory to other work.
/// - After [`order_after`](Backend::order_after)`(waiting, on)` returns `Ok`, no work queued
///   on `waiting` from then on, nor a copy ([`copy_to_device`](Backend::copy_to_device),
///   [`copy_from_device`](Backend::copy_from_device)) on it, touches memory before the work
///   queued on `on` before the call has finished: the allocator then hands memory that `on`'s
///   work used to work on `waiting`.
/// - [`stream_idle`](Backend::stream_idle) returns `Ok(true)` only where an event recorded on
///   the stream at that moment would be done.
/// - The work a stream was ordered after counts as its own: once `order_after(waiting, on)`
///   returned `Ok`, an event recorded on `waiting` later is done, and `waiting` idle, only
///   when `on`'s work queued before that call has finished too (as on CUDA, where a stream
///   waiting for an event is not idle and an event recorded after the wait completes after
///   it). The allocator hands a stream's free memory to another stream while the first is
///   idle, and that memory may be what the first was ordered after.
pub unsafe trait Backend: Send + Sync + fmt::Debug + 'static {
    /// A short name for reports: `host`, `sim` (`sim-cuda` with costly segment calls), `cuda`.
    fn name(&self) -> &str;

    /// Total memory of the device, in bytes.
    fn total_memory(&self) -> u64;

    /// Memory the backend could still hand out, in bytes.
    fn free_memory(&self) -> u64;

    /// Granularity of segments and of page mapping, a power of two.
    fn page_size(&self) -> u64 {
        DEFAULT_PAGE_SIZE
    }

    /// Reserves a segment of `size` bytes (a multiple of the page size), fully mapped, and
    /// returns its base address.
    fn reserve(&self, size: u64) -> Result<u64, BackendError>;

    /// Reserves `span` bytes of addresses (a multiple of the page size, at least `size`) and
    /// maps physical memory under the first `size` bytes as [`reserve`](Backend::reserve) does;
    /// the rest stays unmapped until [`map`](Backend::map)ped, so that the segment can grow in
    /// place. Only backends that [`can_unmap`](Backend::can_unmap) support it. Default: refused.
    fn reserve_growable(&self, size: u64, span: u64) -> Result<u64, BackendError> {
        let _ = (size, span);
        Err(BackendError::Unsupported("growable segments"))
    }

    /// Returns a segment obtained from [`reserve`](Backend::reserve) or
    /// [`reserve_growable`](Backend::reserve_growable) (with the size it has grown to: the
    /// backend frees every address it reserved for it). Pages of it that were
    /// unmapped stay unmapped; the backend frees what is still mapped.
    ///
    /// # Safety
    ///
    /// `addr` and `size` are those of a segment this backend reserved and has not released,
    /// and nothing on the host uses any of its memory any more (no buffer, no pointer from
    /// [`host_ptr`](Backend::host_ptr)). Device work queued before the call may still touch
    /// it (a block freed on its stream is free at once): the backend waits for that work
    /// before the memory can go to anyone else, as `cuMemFree` does.
    unsafe fn release(&self, addr: u64, size: u64) -> Result<(), BackendError>;

    /// Whether reserving and releasing segments is costly next to serving a request from the
    /// cache: on CUDA `cuMemAlloc` takes tens of microseconds and `cuMemFree` synchronizes the
    /// device. The allocator then lets its fragmentation limit rise rather than churn (see
    /// [`LimitMax::Auto`](crate::config::LimitMax::Auto)). Default: `false`.
    fn costly_segments(&self) -> bool {
        false
    }

    /// The device's stream-ordered pool as the driver counts it, where this backend can tell
    /// (the CUDA backends); snapshots carry it ([`Snapshot::driver_pool`](crate::Snapshot::driver_pool)).
    /// Default: `None`.
    fn driver_pool(&self) -> Option<DriverPool> {
        None
    }

    /// Whether this backend serves no memory and stands for memory the program allocated
    /// itself ([`ExternalBackend`]): only then does
    /// [`CachingAllocator::record_external`](crate::CachingAllocator::record_external) accept
    /// addresses, whose segments [`release`](Backend::release) must then leave alone (it is
    /// called when a recorded allocation is forgotten). Default: `false`.
    fn is_external(&self) -> bool {
        false
    }

    /// Whether [`map`](Backend::map) and [`unmap`](Backend::unmap) work.
    fn can_unmap(&self) -> bool {
        false
    }

    /// Gives back the physical memory of whole mappings `[addr, addr + len)` inside a segment,
    /// keeping the addresses reserved. A mapping is what one [`map`](Backend::map) call made,
    /// or one granule of what [`reserve`](Backend::reserve) mapped ([`map_granule`] of the size
    /// reserved, counted from the base); none can be unmapped in part.
    ///
    /// # Safety
    ///
    /// The range is whole mappings inside a segment this backend reserved and has not
    /// released, every byte of it mapped, and nothing on the host uses their memory any more. Device work queued on
    /// `stream` before the call may still use them: the backend orders the unmap after it (the
    /// CUDA backend waits for that stream alone, not for the whole device). No work queued on
    /// any other stream uses them (the allocator waits for the streams a block was recorded on
    /// before the block is free). No view ([`alias`](Backend::alias)) maps any of the range:
    /// a backend refuses to unmap a mapping a view still maps.
    unsafe fn unmap(&self, addr: u64, len: u64, stream: RawStream) -> Result<(), BackendError> {
        let _ = (addr, len, stream);
        Err(BackendError::Unsupported("unmap"))
    }

    /// Maps physical memory under `[addr, addr + len)`, as one mapping (the unit that
    /// [`unmap`](Backend::unmap) gives back): a granule unmapped earlier, or a piece of the
    /// room of a segment from [`reserve_growable`](Backend::reserve_growable). The range lies
    /// in a segment's reserved addresses, starts on a page, and nothing in it is mapped.
    fn map(&self, addr: u64, len: u64) -> Result<(), BackendError> {
        let _ = (addr, len);
        Err(BackendError::Unsupported("map"))
    }

    /// Whether [`alias`](Backend::alias) and [`unalias`](Backend::unalias) work: physical
    /// memory mapped once can be mapped again at other addresses. Default: `false`.
    fn can_alias(&self) -> bool {
        false
    }

    /// Maps the physical memory of the mappings starting at `maps` (whole mappings, as
    /// [`map`](Backend::map) or [`reserve_growable`](Backend::reserve_growable) made them: a
    /// segment's pieces of its [`map_granule`]) once more, in that order, back to back at a new
    /// range of addresses (a *view*, as long as their lengths' sum), and returns its start. The
    /// memory is then reachable at two addresses; the view takes no memory of its own.
    /// Default: refused.
    fn alias(&self, maps: &[u64]) -> Result<u64, BackendError> {
        let _ = maps;
        Err(BackendError::Unsupported("views of mapped memory"))
    }

    /// Unmaps the view of `len` bytes at `addr` that [`alias`](Backend::alias) made and frees
    /// its addresses; its mappings stay mapped where they were.
    ///
    /// # Safety
    ///
    /// `addr` and `len` are those of a view this backend made and has not unaliased, and
    /// nothing on the host uses its memory through it. Device work queued on `stream` may still
    /// use it: the backend orders the unmap after that work, as [`unmap`](Backend::unmap) does;
    /// no work queued on another stream does.
    unsafe fn unalias(&self, addr: u64, len: u64, stream: RawStream) -> Result<(), BackendError> {
        let _ = (addr, len, stream);
        Err(BackendError::Unsupported("views of mapped memory"))
    }

    /// Creates a new stream.
    fn create_stream(&self) -> Result<RawStream, BackendError>;

    /// Records an event on `stream` that completes when the work queued so far on it is done.
    fn record_event(&self, stream: RawStream) -> Result<RawEvent, BackendError>;

    /// Whether `event` has completed. Must not block.
    fn event_completed(&self, event: RawEvent) -> Result<bool, BackendError>;

    /// Destroys an event once the allocator no longer needs it.
    fn destroy_event(&self, event: RawEvent);

    /// Blocks until all work queued on `stream` is done.
    fn synchronize(&self, stream: RawStream) -> Result<(), BackendError>;

    /// Whether all work queued so far on `stream` is done. Must not block. The default records
    /// an event and queries it.
    fn stream_idle(&self, stream: RawStream) -> Result<bool, BackendError> {
        let event = self.record_event(stream)?;
        let done = self.event_completed(event);
        self.destroy_event(event);
        done
    }

    /// Orders the work queued on stream `waiting` from now on after the work queued so far on
    /// stream `on`, without blocking the host where the backend can (CUDA: `waiting` waits
    /// for an event recorded on `on`). The allocator calls it before a cached segment of `on`
    /// serves requests on `waiting`. The default blocks until `on` is done
    /// ([`synchronize`](Backend::synchronize)).
    fn order_after(&self, waiting: RawStream, on: RawStream) -> Result<(), BackendError> {
        let _ = waiting;
        self.synchronize(on)
    }

    /// A host pointer through which the bytes at device address `addr` can be read and written
    /// directly, for backends whose memory lives in this process (the host backend).
    fn host_ptr(&self, addr: u64) -> Option<*mut u8> {
        let _ = addr;
        None
    }

    /// The `cudarc` stream behind a raw stream, on the CUDA backend.
    #[cfg(feature = "cuda-backend")]
    fn cuda_stream(&self, stream: RawStream) -> Option<std::sync::Arc<cudarc::driver::CudaStream>> {
        let _ = stream;
        None
    }

    /// Copies `src` to device address `addr` in order on `stream`: after the work queued on
    /// it before the call (which may still use the memory: a block freed on its stream is
    /// reused on that stream at once), and complete when the call returns. The default
    /// refuses: backends without memory behind them (sim) or with host-addressable memory
    /// (host) do not need it.
    fn copy_to_device(&self, stream: RawStream, addr: u64, src: &[u8]) -> Result<(), BackendError> {
        let _ = (stream, addr, src);
        Err(BackendError::Unsupported("copies to device memory"))
    }

    /// Copies from device address `addr` into `dst` in order on `stream` (after the work
    /// queued on it before the call), complete when the call returns.
    fn copy_from_device(&self, stream: RawStream, addr: u64, dst: &mut [u8]) -> Result<(), BackendError> {
        let _ = (stream, addr, dst);
        Err(BackendError::Unsupported("copies from device memory"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn granule_pieces_tile_the_range_and_tiles_says_so() {
        let page = DEFAULT_PAGE_SIZE;
        for size in [page, 6 * page, (1 << 30) + 3 * page, 8 << 30] {
            let pieces: Vec<(u64, u64)> = granule_pieces(size, page).collect();
            assert!(pieces.iter().all(|&(_, l)| l > 0 && l <= map_granule(size, page)), "{size}");
            assert!(tiles(pieces.iter().copied(), 0, size), "{size}: {pieces:?}");
            assert!(!tiles(pieces.iter().copied(), 0, size + page), "ends short");
            assert!(!tiles(pieces.iter().skip(1).copied(), 0, size), "starts late");
        }
        assert!(!tiles([(0, page), (2 * page, page)], 0, 3 * page), "a gap");
        assert!(!tiles([], 0, page), "nothing");
    }
}

/// Backends are taken by value or shared through an `Arc`.
pub trait IntoBackend {
    /// Converts into a shared backend.
    fn into_backend(self) -> Arc<dyn Backend>;
}

impl<B: Backend> IntoBackend for B {
    fn into_backend(self) -> Arc<dyn Backend> {
        Arc::new(self)
    }
}

impl<B: Backend> IntoBackend for Arc<B> {
    fn into_backend(self) -> Arc<dyn Backend> {
        self
    }
}

impl IntoBackend for Arc<dyn Backend> {
    fn into_backend(self) -> Arc<dyn Backend> {
        self
    }
}

/// A device's stream-ordered memory pool, as the driver counts it (`cuMemPoolGetAttribute`):
/// memory in use by allocations, and memory the pool holds from the device, which includes
/// what freed allocations left cached in it, as PyTorch's reserved memory does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct DriverPool {
    /// Bytes in use by allocations (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    pub used: u64,
    /// The peak of `used` (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`).
    pub used_high: u64,
    /// Bytes the pool holds from the device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub reserved: u64,
    /// The peak of `reserved` (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`).
    pub reserved_high: u64,
}

impl DriverPool {
    /// The pool's four figures.
    pub fn new(used: u64, used_high: u64, reserved: u64, reserved_high: u64) -> DriverPool {
        DriverPool { used, used_high, reserved, reserved_high }
    }
}
