//! The buffer keep-alive protocol: what keeps an allocator's shared state alive while buffers
//! exist, without an `Arc` per buffer.
//!
//! Buffers hold a plain pointer to the shared state. They count themselves in `buffers`, under
//! the allocator's lock, which they take anyway (to allocate and to free their block); while
//! any exist, `keep` holds one strong reference for all of them. Handles (`CachingAllocator`)
//! are strong references of their own. The state is freed when the last of both goes.
//!
//! **The invariant**, true whenever the lock is free: `keep` is set while `buffers > 0`, and
//! the strong count is the number of handles plus one for `keep` (plus references being
//! dropped by their owner, which follow the rules below).
//!
//! **The rules.** Every change to either count that another party could act on is made under
//! the lock: a buffer counts itself there ([`KeepAlive::buffer_made`], taking `keep` if it is
//! unset) and uncounts itself there ([`KeepAlive::buffer_gone`], giving `keep` up if no handle
//! is left); a handle's drop decides there ([`KeepAlive::handle_gone`]) and decrements there,
//! unless it holds the only reference (then no one else can clone it or allocate). So each
//! decision to drop `keep` sees every other handle and buffer. References are dropped after
//! unlocking ([`AfterUnlock::run`]): the lock lives inside the state they may free.
//!
//! A buffer can also make a handle (`Buffer::allocator`): it adds a strong reference while it
//! is counted, so `keep` is set and no decision to drop it (which needs `buffers == 0`) can
//! race. The registry of live allocators upgrades weak references without the lock; an
//! upgrade only adds a handle, which then follows the rules when dropped.
//!
//! `tests/keepalive_loom.rs` explores every interleaving of two handles, a buffer and its
//! drop with loom, on this very file (compiled there with loom's `Arc`), including the race
//! that made the allocator leak when a handle decremented after unlocking.
//!
//! Measured against a plain `Arc` per buffer in BENCHMARKS.md ("Buffers hold a pointer").

use super::sync_shim::Arc;

/// The counts behind the allocator's lock; `T` is the shared state that holds the lock.
pub(crate) struct KeepAlive<T> {
    buffers: usize,
    keep: Option<Arc<T>>,
}

/// What a handle's drop does once the lock is released.
#[must_use = "the references must be dropped after unlocking"]
pub(crate) enum AfterUnlock<T> {
    /// The handle's reference was given up under the lock: nothing is left to do.
    Nothing,
    /// Drop `keep` (if taken), then the handle's own reference, rebuilt from `own`.
    Release { keep: Option<Arc<T>>, own: *const T },
}

impl<T> KeepAlive<T> {
    pub(crate) const fn new() -> Self {
        KeepAlive { buffers: 0, keep: None }
    }

    /// Under the lock: a buffer was made through `handle`; counts it and holds the state for
    /// it.
    pub(crate) fn buffer_made(&mut self, handle: &Arc<T>) {
        self.buffers += 1;
        if self.keep.is_none() {
            self.keep = Some(Arc::clone(handle));
        }
    }

    /// Under the lock: a buffer went. Returns the state's last reference when no handle is
    /// left to make another buffer; the caller drops it after unlocking.
    pub(crate) fn buffer_gone(&mut self) -> Option<Arc<T>> {
        self.buffers -= 1;
        match &self.keep {
            Some(k) if self.buffers == 0 && Arc::strong_count(k) == 1 => self.keep.take(),
            _ => None,
        }
    }

    /// Under the lock: `n` buffers' blocks that sat parked in threads' slots were freed (see
    /// `park`). The caller holds a handle or a live buffer, so `keep` is not the last reference
    /// and stays for that caller's own drop to decide.
    #[allow(dead_code, reason = "tests/keepalive_loom.rs compiles this file without parking")]
    pub(crate) fn unparked(&mut self, n: usize) {
        debug_assert!(self.buffers >= n);
        self.buffers -= n;
    }

    /// Whether `keep` is held (buffers exist, or did since it was last given up).
    #[allow(dead_code, reason = "tests/keepalive_loom.rs compiles this file without parking")]
    pub(crate) fn holds(&self) -> bool {
        self.keep.is_some()
    }

    /// Under the lock: the handle whose reference `own` is (from `Arc::into_raw`) is being
    /// dropped. Either gives the reference up now (another reference outlives the lock), or
    /// says what to drop after unlocking.
    ///
    /// # Safety
    ///
    /// `own` must come from `Arc::into_raw` of a strong reference to the state that holds this
    /// `KeepAlive`, owned by the caller, who must not use it again other than through the
    /// returned [`AfterUnlock`].
    pub(crate) unsafe fn handle_gone(&mut self, own: *const T) -> AfterUnlock<T> {
        match &self.keep {
            // The only reference, with no buffer (none was made since `keep` last went): nobody
            // can clone it or allocate, so it is dropped after unlocking.
            // SAFETY: `own` came from `Arc::into_raw` of a reference the caller still holds; the
            // `Arc` rebuilt to read the count is never dropped.
            None if Arc::strong_count(&std::mem::ManuallyDrop::new(unsafe { Arc::from_raw(own) })) == 1 => {
                AfterUnlock::Release { keep: None, own }
            }
            // This handle and `keep` are the last references and no buffer is left.
            Some(k) if self.buffers == 0 && Arc::strong_count(k) == 2 => {
                AfterUnlock::Release { keep: self.keep.take(), own }
            }
            _ => {
                // SAFETY: the caller's reference is one of at least two (it and another handle
                // or `keep`), so the state outlives this decrement and the caller's lock.
                unsafe { Arc::decrement_strong_count(own) };
                AfterUnlock::Nothing
            }
        }
    }
}

impl<T> AfterUnlock<T> {
    /// Drops what the decision left to drop.
    ///
    /// # Safety
    ///
    /// The lock of the state must have been released, and the decision must come from
    /// [`KeepAlive::handle_gone`] (its `own` is the caller's reference).
    pub(crate) unsafe fn run(self) {
        if let AfterUnlock::Release { keep, own } = self {
            drop(keep);
            // SAFETY: balances the caller's `Arc::into_raw`.
            drop(unsafe { Arc::from_raw(own) });
        }
    }
}
