//! Allocators that record memory the program allocated itself (through cudarc, candle or the
//! CUDA driver directly): each allocation is a segment of its own whose one block is
//! allocated, with the same context (stack, scope, thread, step) and history as the caching
//! allocator's blocks, so that statistics, memory tests, snapshots and every report treat both
//! alike. `vramscope::observe` feeds one from CUDA's own callbacks.

use super::CachingAllocator;
use crate::backend::{ExternalBackend, RawStream};
use crate::error::{Result, UsageError};
use crate::record::Pending;

impl CachingAllocator {
    /// An allocator that hands out nothing and records what [`record_external`](Self::record_external)
    /// reports, for device `device`, named `name` in snapshots and reports. Its configuration
    /// is PyTorch's (no fragmentation limit): nothing is cached.
    ///
    /// ```
    /// use vramscope::CachingAllocator;
    /// let seen = CachingAllocator::external(0, "my framework", 80 << 30);
    /// seen.record_external(0, 0x7f00_0000_0000, 1000)?;
    /// assert_eq!((seen.memory_allocated(), seen.stats().requested_bytes.all.current), (1024, 1000));
    /// assert!(seen.forget_external(0x7f00_0000_0000));
    /// assert_eq!(seen.memory_allocated(), 0);
    /// # Ok::<(), vramscope::Error>(())
    /// ```
    pub fn external(device: usize, name: &str, total_memory: u64) -> CachingAllocator {
        CachingAllocator::external_on(ExternalBackend::new(name, total_memory), device)
    }

    /// [`external`](Self::external) over a backend built beforehand (one that reads the
    /// device's stream-ordered pool for snapshots: [`ExternalBackend::with_driver_pool`]).
    pub fn external_on(backend: ExternalBackend, device: usize) -> CachingAllocator {
        let config = crate::config::AllocatorConfig { fragmentation_limit: None, ..Default::default() };
        CachingAllocator::for_device(backend, device, config)
            .expect("the default configuration without a limit is valid")
    }

    /// Records `bytes` the program allocated at `addr` on stream `stream` (the device API's
    /// handle; `0` the default stream), with the calling thread's stack, scope and step as
    /// this allocator records them. An allocation still recorded at `addr` is forgotten first
    /// (its free was not seen). Only for an allocator made by [`external`](Self::external).
    ///
    /// On any other allocator it is an error ([`UsageError::NotExternal`]): forgetting the
    /// address would give the backend memory it never handed out.
    pub fn record_external(&self, stream: RawStream, addr: u64, bytes: u64) -> Result<()> {
        self.record_made(stream, addr, bytes, crate::alloc::heap::Made::Allocated)
    }

    /// [`record_external`](Self::record_external), saying how the memory was made.
    pub(crate) fn record_made(
        &self,
        stream: RawStream,
        addr: u64,
        bytes: u64,
        made: crate::alloc::heap::Made,
    ) -> Result<()> {
        if !self.shared.backend.is_external() {
            return Err(UsageError::NotExternal { backend: self.shared.backend.name().to_string() }.into());
        }
        let pending = self.shared.capture.get().map(Pending::capture);
        let mut locked = self.shared.lock();
        let ctx = pending.map(|p| {
            p.count_allocation();
            locked.heap.intern(p)
        });
        locked.heap.record_external_at(&*self.shared.backend, stream, addr, bytes, made, ctx)
    }

    /// Forgets the allocation recorded at `addr`: the program freed it. False if none was
    /// (allocated before recording began, or by a call not recorded), and always on an
    /// allocator not made by [`external`](Self::external).
    pub fn forget_external(&self, addr: u64) -> bool {
        self.forget_external_range(addr, 1) == 1
    }

    /// Forgets every allocation recorded at an address in `addr..addr + len`: the program
    /// unmapped that range (as `cuMemUnmap` does, which may cover several mappings). Returns
    /// how many were forgotten; always 0 on an allocator not made by
    /// [`external`](Self::external).
    pub fn forget_external_range(&self, addr: u64, len: u64) -> usize {
        if !self.shared.backend.is_external() {
            return 0;
        }
        let pending = self.shared.capture.get_for_free().map(Pending::capture);
        let mut locked = self.shared.lock();
        let ctx = pending.map(|p| locked.heap.intern(p));
        locked.heap.forget_external_range_at(&*self.shared.backend, addr, len, ctx)
    }
}
