use super::{Backend, RawEvent, RawStream, DEFAULT_PAGE_SIZE};
use crate::error::{fmt_bytes, BackendError};
use std::alloc::Layout;
use std::sync::atomic::{AtomicU64, Ordering};

/// Host memory standing in for a device, with a capacity limit.
///
/// Segments are real allocations from the system allocator, so buffers on this backend hold
/// data that can be written and read ([`Buffer::copy_from_host`](crate::Buffer::copy_from_host),
/// [`Buffer::to_vec`](crate::Buffer::to_vec)). Streams exist as names only: host work is done
/// when it is issued, so events complete at once.
///
/// Memory is committed lazily by the operating system, so a large capacity costs nothing until
/// buffers are written.
///
/// ```
/// use vramscope::{CachingAllocator, backend::HostBackend};
/// let alloc = CachingAllocator::new(HostBackend::new(64 << 20));
/// let stream = alloc.default_stream();
/// let mut buf = alloc.alloc::<u32>(&stream, 4).unwrap();
/// buf.copy_from_host(&[1, 2, 3, 4]).unwrap();
/// assert_eq!(buf.to_vec().unwrap(), vec![1, 2, 3, 4]);
/// ```
#[derive(Debug)]
pub struct HostBackend {
    capacity: u64,
    used: AtomicU64,
    next_stream: AtomicU64,
}

/// Alignment of host segments: generous enough for any element type and for SIMD loads.
const HOST_ALIGN: usize = 4096;

impl HostBackend {
    /// A host backend that hands out at most `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        HostBackend { capacity, used: AtomicU64::new(0), next_stream: AtomicU64::new(1) }
    }

    fn layout(size: u64) -> Result<Layout, BackendError> {
        usize::try_from(size)
            .ok()
            .and_then(|s| Layout::from_size_align(s, HOST_ALIGN).ok())
            .ok_or(BackendError::OutOfMemory { requested: size, message: "size exceeds the host address space".into() })
    }
}

/// Zeroed memory for a segment, null where the system has none. On Unix, anonymous pages
/// mapped without reserving swap: the system zeroes each page when it is first touched, so a
/// segment costs memory only where buffers write (the system allocator's aligned zeroed memory
/// writes every page up front: a 6 GB segment took 6 GB). Elsewhere the system allocator's.
fn zeroed_pages(layout: Layout) -> *mut u8 {
    #[cfg(unix)]
    {
        // SAFETY: an anonymous private mapping of a non-zero length at an address the system
        // chooses; no file or existing memory is involved.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            p.cast()
        }
    }
    #[cfg(not(unix))]
    // SAFETY: `layout` has a non-zero size (checked by the caller) and a valid power-of-two
    // alignment.
    unsafe {
        std::alloc::alloc_zeroed(layout)
    }
}

/// Gives back what [`zeroed_pages`] returned.
///
/// # Safety
///
/// `ptr` came from `zeroed_pages(layout)` with this `layout`, and is not used after.
unsafe fn free_pages(ptr: *mut u8, layout: Layout) {
    #[cfg(unix)]
    // SAFETY: the caller promises `ptr` is a mapping of `layout.size()` bytes made by
    // `zeroed_pages` and no longer used.
    unsafe {
        libc::munmap(ptr.cast(), layout.size());
    }
    #[cfg(not(unix))]
    // SAFETY: the caller promises `ptr` came from `alloc_zeroed(layout)`.
    unsafe {
        std::alloc::dealloc(ptr, layout)
    }
}

// SAFETY: segments are zeroed pages from the system (4096-aligned, disjoint, freed only by
// `release`); `host_ptr` is the identity on them; streams run nothing, so events and
// synchronization are complete at once.
unsafe impl Backend for HostBackend {
    fn name(&self) -> &str {
        "host"
    }

    fn total_memory(&self) -> u64 {
        self.capacity
    }

    fn free_memory(&self) -> u64 {
        self.capacity.saturating_sub(self.used.load(Ordering::Relaxed))
    }

    fn page_size(&self) -> u64 {
        DEFAULT_PAGE_SIZE
    }

    fn reserve(&self, size: u64) -> Result<u64, BackendError> {
        let layout = Self::layout(size)?;
        if layout.size() == 0 {
            return Err(BackendError::Other("zero-sized segment requested".into()));
        }
        let prev = self.used.fetch_add(size, Ordering::Relaxed);
        if prev.checked_add(size).is_none_or(|u| u > self.capacity) {
            self.used.fetch_sub(size, Ordering::Relaxed);
            return Err(BackendError::OutOfMemory {
                requested: size,
                message: format!(
                    "host backend capacity {} reached ({} in use)",
                    fmt_bytes(self.capacity),
                    fmt_bytes(prev)
                ),
            });
        }
        let ptr = zeroed_pages(layout);
        if ptr.is_null() {
            self.used.fetch_sub(size, Ordering::Relaxed);
            return Err(BackendError::OutOfMemory {
                requested: size,
                message: "the system allocator refused the segment".into(),
            });
        }
        Ok(ptr as u64)
    }

    unsafe fn release(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let layout = Self::layout(size)?;
        // SAFETY: the caller promises a segment this backend reserved with this size and has
        // not released, so `addr` came from `zeroed_pages(layout)`.
        unsafe { free_pages(addr as *mut u8, layout) };
        self.used.fetch_sub(size, Ordering::Relaxed);
        Ok(())
    }

    fn create_stream(&self) -> Result<RawStream, BackendError> {
        Ok(self.next_stream.fetch_add(1, Ordering::Relaxed))
    }

    fn record_event(&self, _stream: RawStream) -> Result<RawEvent, BackendError> {
        Ok(0)
    }

    fn event_completed(&self, _event: RawEvent) -> Result<bool, BackendError> {
        Ok(true)
    }

    fn destroy_event(&self, _event: RawEvent) {}

    fn synchronize(&self, _stream: RawStream) -> Result<(), BackendError> {
        Ok(())
    }

    fn host_ptr(&self, addr: u64) -> Option<*mut u8> {
        Some(addr as *mut u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_zeroed_writable_and_capped() {
        let host = HostBackend::new(4 << 20);
        let a = host.reserve(2 << 20).unwrap();
        let p = host.host_ptr(a).unwrap();
        // SAFETY: `a` is a live 2 MiB segment of this backend.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p, 2 << 20) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[12345] = 7;
        assert_eq!(a % HOST_ALIGN as u64, 0);
        assert!(host.reserve(4 << 20).is_err());
        assert_eq!(host.free_memory(), 2 << 20);
        // SAFETY: `a` is a live segment of this backend and `bytes` is not used again.
        unsafe { host.release(a, 2 << 20) }.unwrap();
        assert_eq!(host.free_memory(), 4 << 20);
    }

    /// A segment costs memory only where it is written: reserving 1 GiB leaves the process's
    /// resident memory about where it was.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_reserved_segment_is_not_committed() {
        let resident = || {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
            statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
        };
        let host = HostBackend::new(2 << 30);
        let before = resident();
        let a = host.reserve(1 << 30).unwrap();
        let grew = resident().saturating_sub(before);
        assert!(grew < 64 << 20, "reserving 1 GiB made {grew} bytes resident");
        // SAFETY: `a` is a live segment of this backend, never used.
        unsafe { host.release(a, 1 << 30) }.unwrap();
    }
}
