use super::{Backend, RawEvent, RawStream};
use crate::error::BackendError;
use crate::sync::Mutex;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Which memory requests a [`FaultyBackend`] fails.
///
/// Requests are counted from 0 over [`Backend::reserve`], [`Backend::reserve_growable`] and
/// [`Backend::map`] calls together: each is a request for physical memory.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum FaultPlan {
    /// Fail nothing.
    #[default]
    Never,
    /// Fail the requests with these indices.
    Nth(BTreeSet<u64>),
    /// Fail every request whose index is at least this.
    From(u64),
    /// Fail every request larger than this many bytes.
    Above(u64),
    /// Fail the requests for which the function returns `true`, given the request's index and size.
    Custom(std::sync::Arc<dyn Fn(u64, u64) -> bool + Send + Sync>),
}

impl fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultPlan::Never => f.write_str("Never"),
            FaultPlan::Nth(s) => f.debug_tuple("Nth").field(s).finish(),
            FaultPlan::From(k) => f.debug_tuple("From").field(k).finish(),
            FaultPlan::Above(b) => f.debug_tuple("Above").field(b).finish(),
            FaultPlan::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl FaultPlan {
    /// Fails exactly the `k`-th request (counting from 0).
    pub fn nth(k: u64) -> Self {
        FaultPlan::Nth(BTreeSet::from([k]))
    }

    fn fails(&self, index: u64, size: u64) -> bool {
        match self {
            FaultPlan::Never => false,
            FaultPlan::Nth(set) => set.contains(&index),
            FaultPlan::From(k) => index >= *k,
            FaultPlan::Above(b) => size > *b,
            FaultPlan::Custom(f) => f(index, size),
        }
    }
}

/// Wraps a backend and fails chosen memory requests with an out-of-memory error, for testing
/// the allocator's out-of-memory path and the code above it.
///
/// ```
/// use vramscope::{CachingAllocator, backend::FaultPlan, backend::FaultyBackend, backend::SimBackend};
/// use std::sync::Arc;
/// // Fail the first memory request only: the allocator's retry (request 1) succeeds.
/// let faulty = Arc::new(FaultyBackend::new(SimBackend::new(1 << 30), FaultPlan::nth(0)));
/// let alloc = CachingAllocator::new(faulty.clone());
/// let s = alloc.default_stream();
/// let buf = alloc.alloc::<u8>(&s, 4 << 20).unwrap();
/// assert_eq!(faulty.injected(), 1);
/// assert_eq!(alloc.stats().num_alloc_retries, 1);
///
/// // Fail everything from now on: the request is an out-of-memory error.
/// faulty.set_plan(FaultPlan::From(0));
/// let err = alloc.alloc::<u8>(&s, 64 << 20).unwrap_err();
/// assert!(err.to_string().contains("out of memory"));
/// drop(buf);
/// ```
pub struct FaultyBackend<B> {
    inner: B,
    plan: Mutex<FaultPlan>,
    requests: AtomicU64,
    injected: AtomicU64,
    /// Which stream waits (`synchronize` and `order_after` calls) fail, counted on their own.
    waits_plan: Mutex<FaultPlan>,
    waits: AtomicU64,
}

impl<B: Backend> fmt::Debug for FaultyBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyBackend")
            .field("inner", &self.inner)
            .field("plan", &*self.plan.lock())
            .field("requests", &self.requests.load(Ordering::Relaxed))
            .field("injected", &self.injected.load(Ordering::Relaxed))
            .field("waits_plan", &*self.waits_plan.lock())
            .field("waits", &self.waits.load(Ordering::Relaxed))
            .finish()
    }
}

impl<B: Backend> FaultyBackend<B> {
    /// Wraps `inner`, failing the requests `plan` names.
    pub fn new(inner: B, plan: FaultPlan) -> Self {
        FaultyBackend {
            inner,
            plan: Mutex::new(plan),
            requests: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            waits_plan: Mutex::new(FaultPlan::Never),
            waits: AtomicU64::new(0),
        }
    }

    /// Also fails the stream waits (`synchronize` and `order_after` calls) that `plan` names,
    /// counted from 0 over those calls alone (the size the plan sees is 0), with a backend error
    /// other than out of memory: for testing what the allocator does when it cannot wait for a
    /// stream (before another stream takes over its cached segment, or to complete pending
    /// frees).
    pub fn set_wait_plan(&self, plan: FaultPlan) {
        *self.waits_plan.lock() = plan;
    }

    /// Replaces the plan; the request count goes on from where it is.
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.plan.lock() = plan;
    }

    /// Memory requests seen so far (reserve and map calls).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Failures injected so far (memory requests and stream waits).
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Counts one call in `count`; if `plan` fails it, counts the failure and returns the
    /// call's index.
    fn inject(&self, plan: &Mutex<FaultPlan>, count: &AtomicU64, size: u64) -> Option<u64> {
        let index = count.fetch_add(1, Ordering::Relaxed);
        let fails = plan.lock().fails(index, size);
        if fails {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        fails.then_some(index)
    }

    /// Counts a stream wait and fails it if the wait plan says so.
    fn check_wait(&self) -> Result<(), BackendError> {
        match self.inject(&self.waits_plan, &self.waits, 0) {
            Some(index) => Err(BackendError::Other(format!("injected failure of stream wait #{index}"))),
            None => Ok(()),
        }
    }

    /// Counts a memory request and fails it if the plan says so.
    fn check(&self, size: u64) -> Result<(), BackendError> {
        match self.inject(&self.plan, &self.requests, size) {
            Some(index) => Err(BackendError::OutOfMemory {
                requested: size,
                message: format!("injected failure of memory request #{index}"),
            }),
            None => Ok(()),
        }
    }
}

// SAFETY: every call goes to the inner backend, which keeps its promises; failing a request
// (an error) promises nothing.
unsafe impl<B: Backend> Backend for FaultyBackend<B> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn total_memory(&self) -> u64 {
        self.inner.total_memory()
    }
    fn free_memory(&self) -> u64 {
        self.inner.free_memory()
    }
    fn page_size(&self) -> u64 {
        self.inner.page_size()
    }
    fn reserve(&self, size: u64) -> Result<u64, BackendError> {
        self.check(size)?;
        self.inner.reserve(size)
    }
    fn reserve_growable(&self, size: u64, span: u64) -> Result<u64, BackendError> {
        self.check(size)?;
        self.inner.reserve_growable(size, span)
    }
    unsafe fn release(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        // SAFETY: the caller's promise, passed on; segments are the inner backend's.
        unsafe { self.inner.release(addr, size) }
    }
    fn can_unmap(&self) -> bool {
        self.inner.can_unmap()
    }
    fn is_external(&self) -> bool {
        self.inner.is_external()
    }
    fn driver_pool(&self) -> Option<crate::backend::DriverPool> {
        self.inner.driver_pool()
    }
    fn costly_segments(&self) -> bool {
        self.inner.costly_segments()
    }
    unsafe fn unmap(&self, addr: u64, len: u64, stream: RawStream) -> Result<(), BackendError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.inner.unmap(addr, len, stream) }
    }
    fn map(&self, addr: u64, len: u64) -> Result<(), BackendError> {
        self.check(len)?;
        self.inner.map(addr, len)
    }
    fn can_alias(&self) -> bool {
        self.inner.can_alias()
    }
    fn alias(&self, maps: &[u64]) -> Result<u64, BackendError> {
        self.inner.alias(maps)
    }
    unsafe fn unalias(&self, addr: u64, len: u64, stream: RawStream) -> Result<(), BackendError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.inner.unalias(addr, len, stream) }
    }
    fn create_stream(&self) -> Result<RawStream, BackendError> {
        self.inner.create_stream()
    }
    fn record_event(&self, stream: RawStream) -> Result<RawEvent, BackendError> {
        self.inner.record_event(stream)
    }
    fn event_completed(&self, event: RawEvent) -> Result<bool, BackendError> {
        self.inner.event_completed(event)
    }
    fn destroy_event(&self, event: RawEvent) {
        self.inner.destroy_event(event)
    }
    fn stream_idle(&self, stream: RawStream) -> Result<bool, BackendError> {
        self.inner.stream_idle(stream)
    }
    fn synchronize(&self, stream: RawStream) -> Result<(), BackendError> {
        self.check_wait()?;
        self.inner.synchronize(stream)
    }
    fn order_after(&self, waiting: RawStream, on: RawStream) -> Result<(), BackendError> {
        self.check_wait()?;
        self.inner.order_after(waiting, on)
    }
    fn host_ptr(&self, addr: u64) -> Option<*mut u8> {
        self.inner.host_ptr(addr)
    }
    fn copy_to_device(&self, stream: RawStream, addr: u64, src: &[u8]) -> Result<(), BackendError> {
        self.inner.copy_to_device(stream, addr, src)
    }
    #[cfg(feature = "cuda-backend")]
    fn cuda_stream(&self, stream: RawStream) -> Option<std::sync::Arc<cudarc::driver::CudaStream>> {
        self.inner.cuda_stream(stream)
    }
    fn copy_from_device(&self, stream: RawStream, addr: u64, dst: &mut [u8]) -> Result<(), BackendError> {
        self.inner.copy_from_device(stream, addr, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SimBackend;

    #[test]
    fn fails_exactly_the_planned_requests() {
        let f = FaultyBackend::new(SimBackend::new(1 << 30), FaultPlan::Nth([1, 3].into()));
        let results: Vec<bool> = (0..5).map(|_| f.reserve(2 << 20).is_ok()).collect();
        assert_eq!(results, [true, false, true, false, true]);
        assert_eq!((f.requests(), f.injected()), (5, 2));
        f.set_plan(FaultPlan::Above(4 << 20));
        assert!(f.reserve(4 << 20).is_ok());
        assert!(f.reserve(6 << 20).is_err());
        f.set_plan(FaultPlan::Custom(std::sync::Arc::new(|i, _| i % 2 == 0)));
        assert!(f.reserve(2 << 20).is_ok() != f.reserve(2 << 20).is_ok());
    }
}
