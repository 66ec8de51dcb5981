//! Every allocator alive in the process, so that memory tests can count a test's blocks
//! wherever they were allocated.

use super::{CachingAllocator, Shared};
use crate::sync::Mutex;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Weak};

/// Weak references: the registry never keeps an allocator alive.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// Adds a new allocator, dropping the entries of allocators that are gone.
pub(super) fn register(shared: &Arc<Shared>) {
    let mut live = LIVE.lock();
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(shared));
}

/// Handles to every allocator still alive.
///
/// Each upgraded reference becomes a [`CachingAllocator`] handle, so that dropping it follows
/// the handles' protocol: if it turns out to be the last reference besides the one buffers
/// share, that one is released as when any other last handle goes.
pub(super) fn live() -> Vec<CachingAllocator> {
    let live = LIVE.lock();
    live.iter().filter_map(Weak::upgrade).map(|shared| CachingAllocator { shared: ManuallyDrop::new(shared) }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SimBackend;

    #[test]
    fn allocators_are_listed_while_alive_and_freed_after() {
        let a = CachingAllocator::new(SimBackend::new(1 << 30));
        assert!(live().iter().any(|x| x.same_allocator(&a)));
        let buffer = a.alloc::<u8>(&a.default_stream(), 100).unwrap();
        let weak = Arc::downgrade(&*a.shared);
        drop(a);
        // A buffer keeps its allocator alive, and listing it does not prevent the release.
        assert!(live().iter().any(|x| Arc::ptr_eq(&x.shared, &weak.upgrade().unwrap())));
        drop(buffer);
        assert!(weak.upgrade().is_none(), "the allocator is gone once its last buffer is");
    }
}
