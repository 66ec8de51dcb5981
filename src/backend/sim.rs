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
    /// The next view's address.
    next_view: AtomicU64,
    next_stream: AtomicU64,
    mode: EventMode,
    costly: bool,
    /// Hand out the lowest free range that fits instead of new addresses (see
    /// `reusing_addresses`).
    reuse: bool,
    events: Mutex<Events>,
    /// The reserved segments and their mappings.
    segments: Mutex<Segments>,
}

/// What a [`SimBackend`] has reserved and mapped.
#[derive(Debug, Default)]
struct Segments {
    /// Each segment by base address.
    by_base: BTreeMap<u64, SimSegment>,
    /// Every mapping, by address: its length.
    maps: BTreeMap<u64, u64>,
    /// Every view ([`Backend::alias`]) and the mappings it maps again.
    views: super::views::ViewTable,
}

#[derive(Debug, Clone, Copy)]
struct SimSegment {
    /// Addresses reserved.
    span: u64,
    /// Bytes mapped.
    mapped: u64,
}

#[derive(Debug, Default)]
struct Events {
    next: u64,
    /// Pending (not yet completed) events and the stream each was recorded on.
    pending: HashMap<RawEvent, RawStream>,
}

/// Where simulated addresses start: high, page aligned, and never zero.
const SIM_BASE: u64 = 0x7f00_0000_0000;

/// Where views' addresses start ([`Backend::alias`]): apart from segments', which a sim that
/// reuses addresses places in any gap above [`SIM_BASE`].
const VIEW_BASE: u64 = 0x5000_0000_0000;

impl SimBackend {
    /// The largest capacity a simulated device has: 64 PiB, far beyond any device, and small
    /// enough that 256 address ranges of that size fit in 64-bit addresses.
    pub const MAX_CAPACITY: u64 = 1 << 56;

    /// A simulated device of `capacity` bytes whose events complete at once.
    pub fn new(capacity: u64) -> Self {
        Self::with_events(capacity, EventMode::Immediate)
    }

    /// A simulated device of `capacity` bytes with the given event behaviour. A capacity above
    /// [`SimBackend::MAX_CAPACITY`] is taken as that: the simulated address space must hold
    /// the addresses of many segments that grow in place, each reserving the capacity.
    pub fn with_events(capacity: u64, mode: EventMode) -> Self {
        SimBackend {
            capacity: capacity.min(Self::MAX_CAPACITY),
            page: DEFAULT_PAGE_SIZE,
            used: AtomicU64::new(0),
            next_addr: AtomicU64::new(SIM_BASE),
            next_view: AtomicU64::new(VIEW_BASE),
            next_stream: AtomicU64::new(1),
            mode,
            costly: false,
            reuse: false,
            events: Mutex::new(Events::default()),
            segments: Mutex::new(Segments::default()),
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

    /// Hands out the lowest free range of addresses that fits a segment, as `cuMemAlloc`
    /// reuses freed ones, instead of addresses never used before: for the tests that the
    /// allocator decides the same wherever its segments lie.
    #[cfg(test)]
    pub(crate) fn reusing_addresses(mut self) -> Self {
        self.reuse = true;
        self
    }

    /// Completes every pending event, as if all streams had caught up.
    pub fn complete_events(&self) {
        self.events.lock().pending.clear();
    }

    /// How many views ([`Backend::alias`]) are mapped now.
    pub fn views(&self) -> usize {
        self.segments.lock().views.len()
    }

    /// Bytes currently mapped (reserved and not unmapped).
    pub fn used_memory(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Maps `[addr, addr + len)` as one mapping, or unmaps the whole mappings tiling it.
    fn remap(&self, addr: u64, len: u64, map: bool) -> Result<(), BackendError> {
        let mut guard = self.segments.lock();
        let segs = &mut *guard;
        let aliased = if map { Ok(()) } else { segs.views.refuse_aliased(addr, addr.saturating_add(len)) };
        let (&base, seg) = segs
            .by_base
            .range_mut(..=addr)
            .next_back()
            .ok_or(BackendError::Other(format!("address {addr:#x} is in no segment")))?;
        let end = addr.checked_add(len).filter(|&e| e <= base + seg.span).ok_or_else(|| {
            BackendError::Other(format!(
                "range {addr:#x}+{len} runs past the addresses of the segment at {base:#x} ({} reserved)",
                seg.span
            ))
        })?;
        if len == 0 || !(addr - base).is_multiple_of(self.page) || !len.is_multiple_of(self.page) {
            return Err(BackendError::Other(format!("range {addr:#x}+{len} is not whole pages")));
        }
        // Mappings are made and undone whole, as a device's (one cannot be unmapped in part).
        let inside: Vec<(u64, u64)> = segs.maps.range(addr..end).map(|(&a, &l)| (a, l)).collect();
        let across = segs.maps.range(..addr).next_back().filter(|&(&a, &l)| a + l > addr).is_some();
        if map {
            if across || !inside.is_empty() {
                return Err(BackendError::Other(format!("range {addr:#x}+{len} is mapped already")));
            }
            self.take(len)?;
            segs.maps.insert(addr, len);
            seg.mapped += len;
        } else {
            if across || !super::tiles(inside.iter().copied(), addr, end) {
                return Err(BackendError::Other(format!("range {addr:#x}+{len} is not whole mappings, all mapped")));
            }
            aliased?;
            for (a, _) in inside {
                segs.maps.remove(&a);
            }
            seg.mapped -= len;
            self.used.fetch_sub(len, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The refusal of a segment whose addresses would pass the end of the address space (the
    /// memory taken for it is given back first).
    fn out_of_addresses(&self, size: u64) -> BackendError {
        self.used.fetch_sub(size, Ordering::Relaxed);
        BackendError::OutOfMemory { requested: size, message: "the simulated address space is used up".into() }
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
    /// `sim`, or `sim-cuda` where segment calls are costly (as `vramscope replay --backend
    /// sim-cuda` makes it): a report then says which of the two decided.
    fn name(&self) -> &str {
        if self.costly {
            "sim-cuda"
        } else {
            "sim"
        }
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
        self.reserve_growable(size, size)
    }

    fn reserve_growable(&self, size: u64, span: u64) -> Result<u64, BackendError> {
        if size == 0 || span < size || !size.is_multiple_of(self.page) || !span.is_multiple_of(self.page) {
            return Err(BackendError::Other(format!("a segment of {size} bytes in {span} is not whole pages")));
        }
        // Leave a page-sized gap between segments so that neighbouring segments never touch.
        let gap = span.checked_add(self.page).ok_or(BackendError::OutOfMemory {
            requested: span,
            message: "size exceeds the simulated address space".into(),
        })?;
        self.take(size)?;
        let mut segs = self.segments.lock();
        let addr = if self.reuse {
            // The lowest range of `gap` bytes that no segment (with its gap) overlaps.
            let mut at = SIM_BASE;
            for (&base, seg) in &segs.by_base {
                if base >= at.saturating_add(gap) {
                    break;
                }
                at = at.max(base + seg.span + self.page);
            }
            let end = at.checked_add(gap).ok_or_else(|| self.out_of_addresses(size))?;
            self.next_addr.fetch_max(end, Ordering::Relaxed);
            at
        } else {
            let mut cur = self.next_addr.load(Ordering::Relaxed);
            loop {
                let end = cur.checked_add(gap).ok_or_else(|| self.out_of_addresses(size))?;
                match self.next_addr.compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => break cur,
                    Err(now) => cur = now,
                }
            }
        };
        segs.by_base.insert(addr, SimSegment { span, mapped: size });
        // Mapped in granules, as the CUDA backend maps a segment it reserves.
        for (offset, len) in super::granule_pieces(size, self.page) {
            segs.maps.insert(addr + offset, len);
        }
        Ok(addr)
    }

    unsafe fn release(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let mut segs = self.segments.lock();
        // The size it has grown to: at most its addresses, at least what is mapped in them (a
        // growth undone after a refusal leaves nothing mapped past it).
        let end = addr.saturating_add(size);
        let extent = |segs: &Segments, span: u64| {
            segs.maps.range(addr..addr + span).next_back().map_or(addr, |(&a, &l)| a + l) - addr
        };
        match segs.by_base.get(&addr) {
            Some(seg) if size > 0 && size <= seg.span && extent(&segs, seg.span) <= end - addr => {
                let seg = *seg;
                segs.views.refuse_aliased(addr, addr + seg.span)?;
                segs.by_base.remove(&addr);
                let maps: Vec<u64> = segs.maps.range(addr..addr + seg.span).map(|(&a, _)| a).collect();
                for a in maps {
                    segs.maps.remove(&a);
                }
                self.used.fetch_sub(seg.mapped, Ordering::Relaxed);
                Ok(())
            }
            Some(seg) => Err(BackendError::Other(format!(
                "release of segment {addr:#x} with size {size}, but it maps memory up to {} of {}",
                extent(&segs, seg.span),
                seg.span
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

    fn can_alias(&self) -> bool {
        true
    }

    fn alias(&self, maps: &[u64]) -> Result<u64, BackendError> {
        let mut segs = self.segments.lock();
        if maps.is_empty() {
            return Err(BackendError::Other("a view of no mappings".into()));
        }
        let mut len = 0u64;
        for &p in maps {
            match segs.maps.get(&p) {
                Some(&l) => len += l,
                None => return Err(BackendError::Other(format!("{p:#x} is not the start of a mapping"))),
            }
        }
        let addr = self.next_view.fetch_add(len + self.page, Ordering::Relaxed);
        if addr + len > SIM_BASE {
            return Err(BackendError::Other("the simulated address space for views is spent".into()));
        }
        segs.views.insert(addr, len, maps);
        Ok(addr)
    }

    unsafe fn unalias(&self, addr: u64, len: u64, _stream: RawStream) -> Result<(), BackendError> {
        let mut segs = self.segments.lock();
        segs.views.check(addr, len)?;
        segs.views.remove(addr);
        Ok(())
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

    /// Immediate events: every stream is idle. Manual ones: a stream is idle while no event
    /// recorded on it is pending (the sim runs no work but what its events stand for).
    fn stream_idle(&self, stream: RawStream) -> Result<bool, BackendError> {
        Ok(self.mode == EventMode::Immediate || !self.events.lock().pending.values().any(|&s| s == stream))
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
    fn capacities_near_the_end_of_the_address_space_serve_and_refuse_without_panics() {
        use crate::CachingAllocator;
        for capacity in [u64::MAX, u64::MAX - 1, 1 << 63, SimBackend::MAX_CAPACITY + 1] {
            let sim = SimBackend::new(capacity);
            assert_eq!(sim.total_memory(), SimBackend::MAX_CAPACITY);
            let alloc = CachingAllocator::new(SimBackend::new(capacity).with_costly_segments(true));
            let s = alloc.default_stream();
            let a = alloc.alloc::<u8>(&s, 3 << 20).unwrap();
            let b = alloc.alloc::<u8>(&s, 1 << 40).unwrap();
            drop((a, b));
            alloc.empty_cache();
            alloc.check_invariants().unwrap();
        }
        // Ranges that grow in place each reserve the capacity's addresses: when they are used
        // up, a reservation is refused, and what it took is given back.
        let sim = SimBackend::new(u64::MAX);
        let mut taken = 0;
        let refused = loop {
            match sim.reserve_growable(2 << 20, SimBackend::MAX_CAPACITY) {
                Ok(_) => taken += 1,
                Err(e) => break e,
            }
            assert!(taken < 1000, "the address space never ran out");
        };
        assert!(refused.to_string().contains("address space"), "{refused}");
        assert_eq!(sim.free_memory(), SimBackend::MAX_CAPACITY - taken * (2 << 20));
    }

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
    fn maps_and_unmaps_whole_mappings_only() {
        let sim = SimBackend::new(8 << 30);
        // 1 GiB: mapped in granules of 32 MiB.
        let a = sim.reserve(1 << 30).unwrap();
        let g = super::super::map_granule(1 << 30, DEFAULT_PAGE_SIZE);
        assert_eq!(g, 32 << 20);
        // SAFETY: as above; the simulated backend checks every unmap.
        unsafe {
            assert!(sim.unmap(a + (2 << 20), g, 0).is_err(), "not at a granule's start");
            assert!(sim.unmap(a, g / 2, 0).is_err(), "part of a granule");
            sim.unmap(a + g, 2 * g, 0).unwrap();
            assert!(sim.unmap(a + g, g, 0).is_err(), "not mapped");
            assert!(sim.map(a + g, 2 * g + (2 << 20)).is_err(), "over a mapping");
            // One mapping over two granules, then only whole.
            sim.map(a + g, 2 * g).unwrap();
            assert!(sim.unmap(a + g, g, 0).is_err(), "part of a mapping");
            sim.unmap(a + g, 2 * g, 0).unwrap();
            sim.map(a + g, g).unwrap();
            sim.map(a + 2 * g, g).unwrap();
        }
        // A size that is not a multiple: the last granule is shorter.
        let b = sim.reserve((1 << 30) + (6 << 20)).unwrap();
        // SAFETY: as above.
        unsafe { sim.unmap(b + (1 << 30), 6 << 20, 0).unwrap() };
    }

    #[test]
    fn a_segment_is_released_at_the_size_it_grew_to_whatever_a_refused_growth_did() {
        let sim = SimBackend::new(8 << 20);
        let page = DEFAULT_PAGE_SIZE;
        let a = sim.reserve_growable(page, 8 * page).unwrap();
        sim.map(a + page, page).unwrap();
        let v = sim.alias(&[a + page]).unwrap();
        // Past the capacity: nothing of it stays mapped.
        let used = sim.used_memory();
        assert!(sim.map(a + 2 * page, 3 * page).is_err());
        assert_eq!(sim.used_memory(), used);
        // SAFETY: the simulated backend checks every release; the view goes first.
        unsafe {
            assert!(sim.release(a, 2 * page).is_err(), "a view maps a mapping of it");
            assert!(sim.release(a, page).is_err(), "a page is mapped past the size");
            sim.unalias(v, page, 0).unwrap();
            sim.release(a, 2 * page).unwrap();
        }
        assert_eq!(sim.used_memory(), 0);
    }

    #[test]
    fn views_map_whole_mappings_again_and_keep_them_mapped_until_unaliased() {
        let sim = SimBackend::new(1 << 30);
        let page = DEFAULT_PAGE_SIZE;
        let a = sim.reserve_growable(page, 64 << 20).unwrap();
        sim.map(a + page, page).unwrap();
        sim.map(a + 2 * page, 2 * page).unwrap();
        let used = sim.used_memory();
        assert!(sim.alias(&[a + 3 * page]).is_err(), "not a mapping's start");
        assert!(sim.alias(&[]).is_err(), "no mappings");
        // Two pages' mapping, then the first page's: four pages in all.
        let v = sim.alias(&[a + 2 * page, a]).unwrap();
        assert_eq!(sim.used_memory(), used, "a view takes no memory");
        assert!(v >= a + (64 << 20) || v + 3 * page <= a, "a view's addresses are its own");
        let reusing = SimBackend::new(1 << 30).reusing_addresses();
        let b = reusing.reserve_growable(page, 4 * page).unwrap();
        let w = reusing.alias(&[b]).unwrap();
        let c = reusing.reserve(8 * page).unwrap();
        assert!(w + page <= c || w >= c + 8 * page, "a segment placed later avoids the view too");
        // SAFETY: the simulated backend checks every unmap, release and unalias.
        unsafe {
            assert!(sim.unmap(a, page, 0).is_err(), "a mapping a view maps");
            assert!(sim.unmap(a + 2 * page, 2 * page, 0).is_err(), "the other one");
            sim.unmap(a + page, page, 0).unwrap();
            assert!(sim.release(a, 4 * page).is_err(), "a segment a view maps");
            assert!(sim.unalias(v, 2 * page, 0).is_err(), "the wrong length");
            sim.unalias(v, 3 * page, 0).unwrap();
            assert!(sim.unalias(v, 3 * page, 0).is_err(), "unaliased twice");
            sim.unmap(a, page, 0).unwrap();
            sim.release(a, 4 * page).unwrap();
        }
        assert_eq!(sim.used_memory(), 0);
    }

    #[test]
    fn growable_segments_map_their_room_and_release_it_all() {
        let sim = SimBackend::new(1 << 30);
        let a = sim.reserve_growable(4 << 20, 64 << 20).unwrap();
        assert_eq!(sim.used_memory(), 4 << 20);
        let b = sim.reserve(2 << 20).unwrap();
        assert!(b >= a + (64 << 20), "the room is the segment's own");
        assert!(sim.map(a + (62 << 20), 4 << 20).is_err(), "past the room");
        sim.map(a + (4 << 20), 6 << 20).unwrap();
        assert_eq!(sim.used_memory(), 12 << 20);
        // SAFETY: as above.
        unsafe {
            assert!(sim.release(a, 4 << 20).is_err(), "it grew to 10 MiB");
            sim.release(a, 10 << 20).unwrap();
        }
        assert_eq!(sim.used_memory(), 2 << 20);
        assert!(sim.reserve_growable(4 << 20, 2 << 20).is_err(), "room below the size");
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
