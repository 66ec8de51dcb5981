//! The backend of an allocator that only records memory the program allocated itself
//! ([`CachingAllocator::external`](crate::CachingAllocator::external)): it hands out nothing,
//! and forgetting a recorded allocation gives nothing back (the program freed it).

use super::{Backend, RawEvent, RawStream};
use crate::error::BackendError;

/// A backend that serves no memory: what its allocator holds is what the program allocated
/// through other means and reported ([`CachingAllocator::record_external`](crate::CachingAllocator::record_external)).
pub struct ExternalBackend {
    name: String,
    total: u64,
    pool: Option<PoolReader>,
}

/// Reads a device's stream-ordered pool.
type PoolReader = Box<dyn Fn() -> Option<crate::backend::DriverPool> + Send + Sync>;

impl std::fmt::Debug for ExternalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalBackend").field("name", &self.name).field("total", &self.total).finish()
    }
}

impl ExternalBackend {
    /// A backend named `name` in snapshots and reports (`cuda (observed)`), for a device of
    /// `total` bytes.
    pub fn new(name: impl Into<String>, total: u64) -> Self {
        ExternalBackend { name: name.into(), total, pool: None }
    }

    /// The same, whose snapshots carry what `read` says of the device's stream-ordered pool.
    pub fn with_driver_pool(
        mut self,
        read: impl Fn() -> Option<crate::backend::DriverPool> + Send + Sync + 'static,
    ) -> Self {
        self.pool = Some(Box::new(read));
        self
    }
}

// SAFETY: `reserve` never succeeds, so no segment, host pointer or stream-ordered reuse ever
// rests on this backend's word; `release` of a recorded allocation does nothing (the program
// owns and frees that memory); events complete at once because nothing is queued through it.
unsafe impl Backend for ExternalBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn total_memory(&self) -> u64 {
        self.total
    }

    fn free_memory(&self) -> u64 {
        self.total
    }

    fn page_size(&self) -> u64 {
        512
    }

    fn is_external(&self) -> bool {
        true
    }

    fn driver_pool(&self) -> Option<crate::backend::DriverPool> {
        self.pool.as_ref().and_then(|read| read())
    }

    fn reserve(&self, size: u64) -> Result<u64, BackendError> {
        let _ = size;
        Err(BackendError::Unsupported("an external allocator records memory allocated elsewhere; it allocates none"))
    }

    unsafe fn release(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let _ = (addr, size);
        Ok(())
    }

    fn create_stream(&self) -> Result<RawStream, BackendError> {
        Err(BackendError::Unsupported("an external allocator has the program's streams, not its own"))
    }

    fn record_event(&self, stream: RawStream) -> Result<RawEvent, BackendError> {
        let _ = stream;
        Ok(0)
    }

    fn event_completed(&self, event: RawEvent) -> Result<bool, BackendError> {
        let _ = event;
        Ok(true)
    }

    fn destroy_event(&self, event: RawEvent) {
        let _ = event;
    }

    fn synchronize(&self, stream: RawStream) -> Result<(), BackendError> {
        let _ = stream;
        Ok(())
    }
}
