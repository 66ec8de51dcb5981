//! Virtual-memory segments for the CUDA backend: an address range reserved with
//! `cuMemAddressReserve`, backed page by page with physical memory from `cuMemCreate` mapped by
//! `cuMemMap`, so that the pages under a free hole can be given back (`cuMemUnmap` and
//! `cuMemRelease`) while the addresses around them stay in use. PyTorch's expandable segments
//! use the same driver calls.

use super::driver;
use crate::error::BackendError;
use cudarc::driver::sys;
use std::collections::BTreeMap;

/// The physical pages of every virtual-memory segment, by page address.
#[derive(Debug)]
pub(super) struct Pages {
    prop: sys::CUmemAllocationProp,
    access: sys::CUmemAccessDesc,
    /// The mapping granularity, a power of two (2 MiB on current GPUs).
    pub(super) page: u64,
    handles: BTreeMap<u64, sys::CUmemGenericAllocationHandle>,
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
        Ok(Pages { prop, access, page, handles: BTreeMap::new() })
    }

    /// Reserves `size` bytes of addresses and maps physical memory under all of them.
    pub(super) fn reserve(&mut self, size: u64) -> Result<u64, BackendError> {
        let mut base = 0;
        // SAFETY: `base` is valid for the call; the range is freed in `release` or below.
        unsafe { sys::cuMemAddressReserve(&mut base, size as usize, self.page as usize, 0, 0) }
            .result()
            .map_err(|e| driver("cuMemAddressReserve", e))?;
        if let Err(e) = self.map(base, size) {
            // SAFETY: nothing is mapped in the range (`map` rolled back its pages).
            let _ = unsafe { sys::cuMemAddressFree(base, size as usize) };
            return Err(e);
        }
        Ok(base)
    }

    /// Maps fresh physical pages under `[addr, addr + len)`; on failure, maps none.
    pub(super) fn map(&mut self, addr: u64, len: u64) -> Result<(), BackendError> {
        let mut done = addr;
        let result = (|| {
            while done < addr + len {
                let mut handle = 0;
                // SAFETY: `handle` and `prop` are valid; the handle is released in `unmap_pages`.
                unsafe { sys::cuMemCreate(&mut handle, self.page as usize, &self.prop, 0) }
                    .result()
                    .map_err(|e| driver("cuMemCreate", e))?;
                // SAFETY: `done` is a page of a range reserved by `reserve` with nothing mapped
                // there (the allocator maps only pages it unmapped, and this table checks).
                if let Err(e) = unsafe { sys::cuMemMap(done, self.page as usize, 0, handle, 0) }.result() {
                    // SAFETY: the handle was created above and is mapped nowhere.
                    let _ = unsafe { sys::cuMemRelease(handle) };
                    return Err(driver("cuMemMap", e));
                }
                self.handles.insert(done, handle);
                done += self.page;
            }
            // SAFETY: the whole range is mapped (above); `access` names this device.
            unsafe { sys::cuMemSetAccess(addr, len as usize, &self.access, 1) }
                .result()
                .map_err(|e| driver("cuMemSetAccess", e))
        })();
        if result.is_err() {
            self.unmap_pages(addr, done);
        }
        result
    }

    /// Unmaps and frees the physical pages mapped in `[addr, end)`. The caller has made sure
    /// no queued work uses them (unmapping is not ordered with streams).
    pub(super) fn unmap_pages(&mut self, addr: u64, end: u64) {
        let pages: Vec<(u64, sys::CUmemGenericAllocationHandle)> =
            self.handles.range(addr..end).map(|(&a, &h)| (a, h)).collect();
        for (a, h) in pages {
            // SAFETY: `a` is mapped to `h` (this table says so) and no work uses it any more.
            unsafe {
                let _ = sys::cuMemUnmap(a, self.page as usize);
                let _ = sys::cuMemRelease(h);
            }
            self.handles.remove(&a);
        }
    }

    /// Unmaps whatever is still mapped in the segment and frees its addresses.
    pub(super) fn release(&mut self, addr: u64, size: u64) -> Result<(), BackendError> {
        self.unmap_pages(addr, addr + size);
        // SAFETY: the range was reserved by `reserve` with this size and nothing is mapped in it.
        unsafe { sys::cuMemAddressFree(addr, size as usize) }.result().map_err(|e| driver("cuMemAddressFree", e))
    }

    /// Whether any page of `[addr, end)` is mapped.
    pub(super) fn any_mapped(&self, addr: u64, end: u64) -> bool {
        self.handles.range(addr..end).next().is_some()
    }
}
