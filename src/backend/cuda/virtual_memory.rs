//! Virtual-memory segments for the CUDA backend: an address range reserved with
//! `cuMemAddressReserve`, backed granule by granule ([`map_granule`]) with physical memory from
//! `cuMemCreate` mapped by `cuMemMap`, so that the granules under a free hole can be given back
//! (`cuMemUnmap` and `cuMemRelease`) while the addresses around them stay in use. PyTorch's
//! expandable segments use the same driver calls, a 2 MiB page at a time; one mapping per
//! granule costs about as much as one per page (`tests/gpu/vmm_costs.cpp`: 60 µs on an H100
//! whatever the size), so a segment of gigabytes maps in a few dozen calls, not a thousand.
//! A growable segment reserves more addresses than it maps; the allocator maps its room piece
//! by piece as it grows (`map`: one mapping per call, the unit an unmap gives back whole).

use super::driver;
use crate::backend::{granule_pieces, tiles};
use crate::error::BackendError;
use cudarc::driver::sys;
use std::collections::BTreeMap;

/// The mappings of every virtual-memory segment.
#[derive(Debug)]
pub(super) struct Pages {
    prop: sys::CUmemAllocationProp,
    access: sys::CUmemAccessDesc,
    /// The mapping granularity, a power of two (2 MiB on current GPUs).
    pub(super) page: u64,
    /// Reserved ranges: base to span (the segment's addresses, its room to grow included).
    segments: BTreeMap<u64, u64>,
    /// Mappings, by address: their length and the physical allocation behind them.
    handles: BTreeMap<u64, (u64, sys::CUmemGenericAllocationHandle)>,
    /// Views ([`Pages::alias`]) and the mappings they map again.
    views: crate::backend::views::ViewTable,
}

// SAFETY: `prop` holds a null `win32HandleMetaData` pointer that is never dereferenced; the
// handles are plain integers owned by this table.
unsafe impl Send for Pages {}

impl Pages {
    /// The page table of device `ordinal`, or `None` if the device has no virtual memory
    /// management. The context must be current.
    pub(super) fn new(ordinal: i32) -> Result<Self, BackendError> {
        // SAFETY: a zeroed CUmemAllocationProp is the documented starting point (all optional
        // fields off); the fields set below are the required ones.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = ordinal;
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let mut page = 0usize;
        // SAFETY: `page` and `prop` are valid for the call.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut page,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .map_err(|e| driver("cuMemGetAllocationGranularity", e))?;
        let page = (page as u64).max(super::super::DEFAULT_PAGE_SIZE);
        if !page.is_power_of_two() {
            return Err(BackendError::Other(format!("the mapping granularity {page} is not a power of two")));
        }
        Ok(Pages { prop, access, page, segments: BTreeMap::new(), handles: BTreeMap::new(), views: Default::default() })
    }

    /// Reserves `span` bytes of addresses and maps physical memory under the first `size`, one
    /// mapping per granule ([`map_granule`] of `size`); the rest is the segment's room to grow.
    pub(super) fn reserve(&mut self, size: u64, span: u64) -> Result<u64, BackendError> {
        if span < size || !span.is_multiple_of(self.page) || !size.is_multiple_of(self.page) {
            return Err(BackendError::Other(format!("a segment of {size} bytes in {span} is not whole pages")));
        }
        let mut base = 0;
        // SAFETY: `base` is valid for the call; the range is freed in `release` or below.
        unsafe { sys::cuMemAddressReserve(&mut base, span as usize, self.page as usize, 0, 0) }.result().map_err(
            |e| match span > size {
                // Addresses for room, not memory: not an out-of-memory error (the allocator then
                // reserves the segment without room).
                true => BackendError::Other(format!("cuMemAddressReserve of {span} bytes of addresses: {e}")),
                false => driver("cuMemAddressReserve", e),
            },
        )?;
        self.segments.insert(base, span);
        let mut result = Ok(());
        for (offset, len) in granule_pieces(size, self.page) {
            result = self.map(base + offset, len);
            if result.is_err() {
                break;
            }
        }
        if let Err(e) = result {
            let _ = self.unmap_range(base, base + span);
            self.segments.remove(&base);
            // SAFETY: nothing is mapped in the range any more (unmapped just above).
            let _ = unsafe { sys::cuMemAddressFree(base, span as usize) };
            return Err(e);
        }
        Ok(base)
    }

    /// The reserved segment holding `[addr, end)`: its base and span.
    fn segment_of(&self, addr: u64, end: u64) -> Result<(u64, u64), BackendError> {
        match self.segments.range(..=addr).next_back() {
            Some((&base, &span)) if end <= base + span => Ok((base, span)),
            _ => Err(BackendError::Other(format!("range {addr:#x}..{end:#x} is in no reserved segment"))),
        }
    }

    /// Maps fresh physical memory under `[addr, addr + len)` of a segment's addresses, as one
    /// mapping (one `cuMemCreate` and `cuMemMap`), and makes it accessible; on failure, maps
    /// nothing.
    pub(super) fn map(&mut self, addr: u64, len: u64) -> Result<(), BackendError> {
        let end = addr + len;
        let (base, _) = self.segment_of(addr, end)?;
        if len == 0 || !(addr - base).is_multiple_of(self.page) || !len.is_multiple_of(self.page) {
            return Err(BackendError::Other(format!("range {addr:#x}+{len} is not whole pages")));
        }
        if self.any_mapped(addr, end) {
            return Err(BackendError::Other(format!("range {addr:#x}+{len} is mapped already")));
        }
        let mut handle = 0;
        // SAFETY: `handle` and `prop` are valid; the handle is released in `unmap_range`.
        unsafe { sys::cuMemCreate(&mut handle, len as usize, &self.prop, 0) }
            .result()
            .map_err(|e| driver("cuMemCreate", e))?;
        // SAFETY: `[addr, end)` lies in a range reserved by `reserve` with nothing mapped there
        // (checked above).
        if let Err(e) = unsafe { sys::cuMemMap(addr, len as usize, 0, handle, 0) }.result() {
            // SAFETY: the handle was created above and is mapped nowhere.
            let _ = unsafe { sys::cuMemRelease(handle) };
            return Err(driver("cuMemMap", e));
        }
        self.handles.insert(addr, (len, handle));
        // SAFETY: the range is mapped (above); `access` names this device.
        let access = unsafe { sys::cuMemSetAccess(addr, len as usize, &self.access, 1) }.result();
        if let Err(e) = access {
            let _ = self.unmap_range(addr, end);
            return Err(driver("cuMemSetAccess", e));
        }
        Ok(())
    }

    /// Unmaps and frees the mappings in `[addr, end)`, which must be whole (a mapping cannot
    /// be unmapped in part): one `cuMemUnmap` where they cover the range without a gap, then a
    /// `cuMemRelease` each. The caller has made sure no queued work uses them (unmapping is
    /// not ordered with streams).
    pub(super) fn unmap_range(&mut self, addr: u64, end: u64) -> Result<(), BackendError> {
        self.views.refuse_aliased(addr, end)?;
        if let Some((a, l)) = self.mapping_across(addr) {
            return Err(BackendError::Other(format!("{addr:#x} is inside the mapping at {a:#x} of {l} bytes")));
        }
        let maps: Vec<(u64, u64, sys::CUmemGenericAllocationHandle)> =
            self.handles.range(addr..end).map(|(&a, &(l, h))| (a, l, h)).collect();
        if let Some(&(a, l, _)) = maps.last() {
            if a + l > end {
                return Err(BackendError::Other(format!("{end:#x} is inside the mapping at {a:#x} of {l} bytes")));
            }
        }
        let tiled = tiles(maps.iter().map(|&(a, l, _)| (a, l)), addr, end);
        let mut first_error = None;
        if tiled {
            // SAFETY: `[addr, end)` is exactly these mappings, which nothing uses any more.
            if let Err(e) = unsafe { sys::cuMemUnmap(addr, (end - addr) as usize) }.result() {
                first_error = Some(driver("cuMemUnmap", e));
            }
        } else {
            for &(a, l, _) in &maps {
                // SAFETY: `[a, a + l)` is one whole mapping, which nothing uses any more.
                if let Err(e) = unsafe { sys::cuMemUnmap(a, l as usize) }.result() {
                    first_error.get_or_insert(driver("cuMemUnmap", e));
                }
            }
        }
        if let Some(e) = first_error {
            // Unmapped or not, the table must not claim what the driver may still hold: keep
            // the handles (a later release of the segment tries again).
            return Err(e);
        }
        for (a, _, h) in maps {
            // SAFETY: the handle's only mapping was removed above.
            let _ = unsafe { sys::cuMemRelease(h) };
            self.handles.remove(&a);
        }
        Ok(())
    }

    /// Unmaps whatever is still mapped in the segment (its room included) and frees all its
    /// addresses. `size` is the size it has grown to.
    pub(super) fn release(&mut self, addr: u64, size: u64) -> Result<(), BackendError> {
        let span = match self.segments.get(&addr) {
            Some(&span) if size <= span => span,
            _ => return Err(BackendError::Other(format!("release of unknown segment {addr:#x} of {size} bytes"))),
        };
        self.unmap_range(addr, addr + span)?;
        self.segments.remove(&addr);
        // SAFETY: the range was reserved by `reserve` with this span and nothing is mapped in it.
        unsafe { sys::cuMemAddressFree(addr, span as usize) }.result().map_err(|e| driver("cuMemAddressFree", e))
    }

    /// Maps the physical memory of the mappings starting at `maps` once more, whole and in
    /// order, back to back at a new range of addresses (one `cuMemAddressReserve`, a `cuMemMap`
    /// per mapping, one `cuMemSetAccess`), and returns its start; on failure, maps nothing.
    pub(super) fn alias(&mut self, maps: &[u64]) -> Result<u64, BackendError> {
        if maps.is_empty() {
            return Err(BackendError::Other("a view of no mappings".into()));
        }
        let mut handles = Vec::with_capacity(maps.len());
        for &p in maps {
            match self.handles.get(&p) {
                Some(&(len, h)) => handles.push((len, h)),
                None => return Err(BackendError::Other(format!("{p:#x} is not the start of a mapping"))),
            }
        }
        let len: u64 = handles.iter().map(|&(l, _)| l).sum();
        let mut base = 0;
        // SAFETY: `base` is valid for the call; the range is freed in `unalias` or below.
        unsafe { sys::cuMemAddressReserve(&mut base, len as usize, self.page as usize, 0, 0) }
            .result()
            .map_err(|e| BackendError::Other(format!("cuMemAddressReserve of {len} bytes for a view: {e}")))?;
        let mut mapped = 0u64;
        let mut result = Ok(());
        for &(l, h) in &handles {
            // SAFETY: `[base + mapped, + l)` lies in the range reserved above, nothing mapped
            // there; `h` is a live handle of exactly `l` bytes (its mapping's length).
            if let Err(e) = unsafe { sys::cuMemMap(base + mapped, l as usize, 0, h, 0) }.result() {
                result = Err(driver("cuMemMap", e));
                break;
            }
            mapped += l;
        }
        if result.is_ok() {
            // SAFETY: the whole range is mapped (above); `access` names this device.
            result = unsafe { sys::cuMemSetAccess(base, len as usize, &self.access, 1) }
                .result()
                .map_err(|e| driver("cuMemSetAccess", e));
        }
        if let Err(e) = result {
            if mapped > 0 {
                // SAFETY: `[base, base + mapped)` was mapped above and nothing uses it.
                let _ = unsafe { sys::cuMemUnmap(base, mapped as usize) };
            }
            // SAFETY: reserved above; nothing is mapped in it any more.
            let _ = unsafe { sys::cuMemAddressFree(base, len as usize) };
            return Err(e);
        }
        self.views.insert(base, len, maps);
        Ok(base)
    }

    /// Unmaps the view of `len` bytes at `addr` and frees its addresses; its mappings stay
    /// mapped where they were. The caller has made sure no queued work uses the view.
    pub(super) fn unalias(&mut self, addr: u64, len: u64) -> Result<(), BackendError> {
        self.views.check(addr, len)?;
        // SAFETY: `[addr, addr + len)` is a view mapped by `alias`, which nothing uses any more.
        unsafe { sys::cuMemUnmap(addr, len as usize) }.result().map_err(|e| driver("cuMemUnmap", e))?;
        // SAFETY: reserved by `alias` with this length; nothing is mapped in it any more.
        let freed = unsafe { sys::cuMemAddressFree(addr, len as usize) }.result();
        self.views.remove(addr);
        freed.map_err(|e| driver("cuMemAddressFree", e))
    }

    /// Whether any byte of `[addr, end)` is mapped.
    pub(super) fn any_mapped(&self, addr: u64, end: u64) -> bool {
        self.handles.range(addr..end).next().is_some() || self.mapping_across(addr).is_some()
    }

    /// The mapping that starts below `addr` and runs past it (its address and length), if any.
    fn mapping_across(&self, addr: u64) -> Option<(u64, u64)> {
        self.handles.range(..addr).next_back().map(|(&a, &(l, _))| (a, l)).filter(|&(a, l)| a + l > addr)
    }
}
