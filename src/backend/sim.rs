use super::{Backend, RawEvent, RawStream, DEFAULT_PAGE_SIZE};
use crate::error::{fmt_bytes, BackendError};
use crate::sync::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

/// When the events of a [`SimBackend`] complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EventMode {
    /// Events complete as soon as they are recorded, as on the host (the default).
    #[default]
    Immediate,
    /// Events complete only when their stream is synchronized or
    /// [`SimBackend::complete_events`] is called: models a GPU whose queued work is still
    /// running, for testing cross-stream reuse.
    Manual,
}

/// An address-only device: any capacity, no memory behind it.
///
/// It hands out addresses from a private address range and keeps account of capacity and
/// mapped pages, which makes it the backend for replaying traces of any size (an 80 GB training
/// run on a laptop) and for benchmarks of the allocator alone. It supports page unmapping like
/// CUDA's virtual memory management.
///
/// ```
/// use vramscope::{CachingAllocator, backend::SimBackend};
/// let alloc = CachingAllocator::new(SimBackend::new(80 << 30));
/// let s = alloc.default_stream();
/// let big = alloc.alloc::<u8>(&s, 40 << 30).unwrap();
/// assert_eq!(alloc.memory_allocated(), 40 << 30);
/// drop(big);
/// ```
#[derive(Debug)]
pub struct SimBackend {
    capacity: u64,
    page: u64,
    used: AtomicU64,
    next_addr: AtomicU64,
    next_stream: AtomicU64,
    mode: EventMode,
    costly: bool,
    events: Mutex<Events>,
    /// Mapped bytes of each reserved segment, by base address.
    segments: Mutex<BTreeMap<u64, (u64, u64)>>,
}

#[derive(Debug, Default)]
struct Events {
    next: u64,
    /// Pending (not yet completed) events and the stream each was recorded on.
    pending: HashMap<RawEvent, RawStream>,
}

/// Where simulated addresses start: high, page aligned, and never zero.
const SIM_BASE: u64 = 0x7f00_0000_0000;

impl SimBackend {
    /// A simulated device of `capacity` bytes whose events complete at once.
    pub fn new(capacity: u64) -> Self {
        Self::with_events(capacity, EventMode::Immediate)
    }

    /// A simulated device of `capacity` bytes with the given event behaviour.
    pub fn with_events(capacity: u64, mode: EventMode) -> Self {
        SimBackend {
            capacity,
            page: DEFAULT_PAGE_SIZE,
            used: AtomicU64::new(0),
            next_addr: AtomicU64::new(SIM_BASE),
            next_stream: AtomicU64::new(1),
            mode,
            costly: false,
            events: Mutex::new(Events::default()),
            segments: Mutex::new(BTreeMap::new()),
        }
    }

    /// Declares segment calls costly, as CUDA's are (see [`Backend::costly_segments`]): with
    /// the default configuration the allocator then lets its fragmentation limit rise on churn,
    /// as it does on a GPU. With `release_pages:false` in the configuration, a sim backend so
    /// declared models CUDA's `cuMemAlloc` segments.
    ///
    /// ```
    /// use vramscope::{CachingAllocator, backend::SimBackend};
    /// let alloc = CachingAllocator::new(SimBackend::new(1 << 30).with_costly_segments(true));
    /// assert_eq!(alloc.fragmentation_limit(), Some(1.05)); // rises only when it churns
    /// ```
    pub fn with_costly_segments(mut self, costly: bool) -> Self {
        self.costly = costly;
        self
    }

    /// Completes every pending event, as if all streams had caught up.
    pub fn complete_events(&self) {
        self.events.lock().pending.clear();
    }

    /// Bytes currently mapped (reserved and not unmapped).
    pub fn used_memory(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Adjusts the mapped bytes of the segment holding `[addr, addr + len)`.
    fn remap(&self, addr: u64, len: u64, map: bool) -> Result<(), BackendError> {
        let mut segs = self.segments.lock();
        let (base, (size, mapped)) = segs
            .range_mut(..=addr)
            .next_back()
            .ok_or(BackendError::Other(format!("address {addr:#x} is in no segment")))?;
        if addr.saturating_add(len) > base + *size {
            return Err(BackendError::Other(format!(
                "range {addr:#x}+{len} runs past the segment at {base:#x} of {size} bytes"
            )));
        }
        // Whole granules only, as a device's mappings (one cannot be unmapped in part).
        if len == 0 {
            return Err(BackendError::Other(format!("an empty range at {addr:#x}")));
        }
        super::whole_granules(*base, *size, self.page, addr, addr + len)?;
        if map {
            if *mapped + len > *size {
                return Err(BackendError::Other(format!("range {addr:#x}+{len} is mapped already")));
            }
            self.take(len)?;
            *mapped += len;
        } else {
            if len > *mapped {
                return Err(BackendError::Other(format!("range {addr:#x}+{len} is not mapped")));
            }
            *mapped -= len;
            self.used.fetch_sub(len, Ordering::Relaxed);
        }
        Ok(())
    }

    fn take(&self, size: u64) -> Result<(), BackendError> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let new =
                cur.checked_add(size).filter(|&n| n <= self.capacity).ok_or_else(|| BackendError::OutOfMemory {
                    requested: size,
                    message: format!(
                        "simulated device capacity {} reached ({} in use)",
                        fmt_bytes(self.capacity),
                        fmt_bytes(cur)
                    ),
                })?;
            match self.used.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }
}

// SAFETY: address space only: segments are disjoint page-aligned ranges (a page apart) and
// there is no host pointer, so no memory is ever touched; events complete when the backend's
// mode says, and synchronizing a stream completes its events.
unsafe impl Backend for SimBackend {
    fn name(&self) -> &str {
        "sim"
    }

    fn total_memory(&self) -> u64 {
        self.capacity
    }

    fn free_memory(&self) -> u64 {
        self.capacity.saturating_sub(self.used.load(Ordering::Relaxed))
    }

    fn page_size(&self) -> u64 {
        self.page
    }

    fn reserve(&self, size: u64) -> Result<u64, BackendError> {
        self.take(size)?;
        // Leave a page-sized gap between segments so that neighbouring segments never touch.
        let span = size.checked_add(self.page).ok_or(BackendError::OutOfMemory {
            requested: size,
            message: "size exceeds the simulated address space".into(),
        })?;
        let addr = self.next_addr.fetch_add(span, Ordering::Relaxed);
        self.segments.lock().insert(addr, (size, size));
        Ok(addr)
    }

    unsafe fn release(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let mut segs = self.segments.lock();
        match segs.get(&addr) {
            Some(&(s, mapped)) if s == size => {
                segs.remove(&addr);
                self.used.fetch_sub(mapped, Ordering::Relaxed);
                Ok(())
            }
            Some(&(s, _)) => Err(BackendError::Other(format!(
                "release of segment {addr:#x} with size {size}, but it was reserved with {s}"
            ))),
            None => Err(BackendError::Other(format!("release of unknown segment {addr:#x}"))),
        }
    }

    fn can_unmap(&self) -> bool {
        true
    }

    fn costly_segments(&self) -> bool {
        self.costly
    }

    unsafe fn unmap(&self, addr: u64, len: u64, _stream: RawStream) -> Result<(), BackendError> {
        self.remap(addr, len, false)
    }

    fn map(&self, addr: u64, len: u64) -> Result<(), BackendError> {
        self.remap(addr, len, true)
    }

    fn create_stream(&self) -> Result<RawStream, BackendError> {
        Ok(self.next_stream.fetch_add(1, Ordering::Relaxed))
    }

    fn record_event(&self, stream: RawStream) -> Result<RawEvent, BackendError> {
        let mut ev = self.events.lock();
        ev.next += 1;
        let id = ev.next;
        if self.mode == EventMode::Manual {
            ev.pending.insert(id, stream);
        }
        Ok(id)
    }

    fn event_completed(&self, event: RawEvent) -> Result<bool, BackendError> {
        Ok(self.mode == EventMode::Immediate || !self.events.lock().pending.contains_key(&event))
    }

    fn destroy_event(&self, event: RawEvent) {
        if self.mode == EventMode::Manual {
            self.events.lock().pending.remove(&event);
        }
    }

    fn synchronize(&self, stream: RawStream) -> Result<(), BackendError> {
        if self.mode == EventMode::Manual {
            self.events.lock().pending.retain(|_, s| *s != stream);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_for_capacity_and_mapped_pages() {
        let sim = SimBackend::new(10 << 20);
        let a = sim.reserve(8 << 20).unwrap();
        assert!(matches!(sim.reserve(4 << 20), Err(BackendError::OutOfMemory { .. })));
        // SAFETY: no memory lies behind the simulated backend's addresses and nothing here
        // uses them; it checks every release and unmap, and refuses the wrong ones tried here.
        unsafe {
            sim.unmap(a + (2 << 20), 4 << 20, 0).unwrap();
            assert_eq!(sim.free_memory(), 6 << 20);
            let b = sim.reserve(4 << 20).unwrap();
            assert!(b >= a + (8 << 20), "segments never overlap");
            assert!(sim.map(a + (2 << 20), 4 << 20).is_err(), "over capacity");
            sim.release(b, 4 << 20).unwrap();
            sim.map(a + (2 << 20), 4 << 20).unwrap();
            assert!(sim.map(a, 2 << 20).is_err(), "already mapped");
            assert!(sim.release(a, 4 << 20).is_err(), "wrong size");
            sim.release(a, 8 << 20).unwrap();
            assert_eq!(sim.used_memory(), 0);
            assert!(sim.release(a, 8 << 20).is_err(), "released twice");
        }
    }

    #[test]
    fn maps_and_unmaps_whole_granules_only() {
        let sim = SimBackend::new(8 << 30);
        // 1 GiB: granules of 32 MiB.
        let a = sim.reserve(1 << 30).unwrap();
        let g = super::super::map_granule(1 << 30, DEFAULT_PAGE_SIZE);
        assert_eq!(g, 32 << 20);
        // SAFETY: as above; the simulated backend checks every unmap.
        unsafe {
            assert!(sim.unmap(a + (2 << 20), g, 0).is_err(), "not at a granule's start");
            assert!(sim.unmap(a, g / 2, 0).is_err(), "part of a granule");
            sim.unmap(a + g, 2 * g, 0).unwrap();
            assert!(sim.map(a + g, g + (2 << 20)).is_err(), "part of a granule");
            sim.map(a + g, g).unwrap();
            sim.map(a + 2 * g, g).unwrap();
        }
        // A size that is not a multiple: the last granule is shorter.
        let b = sim.reserve((1 << 30) + (6 << 20)).unwrap();
        let g = super::super::map_granule((1 << 30) + (6 << 20), DEFAULT_PAGE_SIZE);
        // SAFETY: as above.
        unsafe { sim.unmap(b + (1 << 30), 6 << 20, 0).unwrap() };
        assert_eq!(g, 32 << 20);
    }

    #[test]
    fn manual_events_complete_on_synchronize() {
        let sim = SimBackend::with_events(1 << 20, EventMode::Manual);
        let s = sim.create_stream().unwrap();
        let e1 = sim.record_event(s).unwrap();
        let e0 = sim.record_event(0).unwrap();
        assert!(!sim.event_completed(e1).unwrap());
        sim.synchronize(s).unwrap();
        assert!(sim.event_completed(e1).unwrap());
        assert!(!sim.event_completed(e0).unwrap());
        sim.complete_events();
        assert!(sim.event_completed(e0).unwrap());
    }
}
