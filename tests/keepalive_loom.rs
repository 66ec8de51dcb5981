//! The buffer keep-alive protocol (`src/alloc/keepalive.rs`, compiled here with loom's `Arc`
//! and driven through loom's mutex and threads, the way `CachingAllocator` and `Buffer` drive
//! it) under every interleaving loom finds: the shared state is freed exactly once, after the
//! last handle and the last buffer, never while one of them can still reach it.

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Mutex;
use loom::thread;

mod sync_shim {
    pub(crate) use loom::sync::Arc;
}
use sync_shim::Arc;

#[path = "../src/alloc/keepalive.rs"]
mod keepalive;
use keepalive::KeepAlive;

/// The allocator's shared state, reduced to its lock and a count of its drops.
struct Shared {
    state: Mutex<KeepAlive<Shared>>,
    drops: std::sync::Arc<AtomicUsize>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// `CachingAllocator::drop`.
fn drop_handle(handle: Arc<Shared>) {
    let ptr = Arc::into_raw(handle);
    // SAFETY: our reference keeps it alive until `run`.
    let shared = unsafe { &*ptr };
    let mut state = shared.state.lock().unwrap();
    // SAFETY: `ptr` is our reference, from `into_raw`, used only through `after`.
    let after = unsafe { state.handle_gone(ptr) };
    drop(state);
    // SAFETY: unlocked; the decision is `handle_gone`'s.
    unsafe { after.run() };
}

/// `CachingAllocator::alloc`: returns the buffer (its pointer to the state).
fn make_buffer(handle: &Arc<Shared>) -> *const Shared {
    handle.state.lock().unwrap().buffer_made(handle);
    Arc::as_ptr(handle)
}

/// `Buffer::drop` (`Shared::release_buffer`).
fn drop_buffer(buffer: *const Shared) {
    // SAFETY: a counted buffer keeps the state alive.
    let shared = unsafe { &*buffer };
    let mut state = shared.state.lock().unwrap();
    let released = state.buffer_gone();
    drop(state);
    drop(released);
}

/// `Buffer::allocator`: a new handle made from a live buffer.
fn handle_from_buffer(buffer: *const Shared) -> Arc<Shared> {
    // SAFETY: a counted buffer keeps the state alive, so a strong reference may be added.
    unsafe {
        Arc::increment_strong_count(buffer);
        Arc::from_raw(buffer)
    }
}

fn new_shared(drops: &std::sync::Arc<AtomicUsize>) -> Arc<Shared> {
    Arc::new(Shared { state: Mutex::new(KeepAlive::new()), drops: drops.clone() })
}

/// The race of the issue, one interleaving of it per call: handle A is dropped (by
/// `drop_a`) while no buffer exists; meanwhile handle B allocates, is dropped, then drops its
/// buffer. The state must be freed exactly once.
fn handle_dropped_while_another_allocates(drop_a: fn(Arc<Shared>)) {
    let drops = std::sync::Arc::new(AtomicUsize::new(0));
    let a = new_shared(&drops);
    let b = a.clone();
    let t = thread::spawn(move || {
        let buffer = make_buffer(&b);
        drop_handle(b);
        drop_buffer(buffer);
    });
    drop_a(a);
    t.join().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the state was never freed, or freed twice");
}

#[test]
fn a_handle_dropped_while_another_allocates_and_frees() {
    loom::model(|| handle_dropped_while_another_allocates(drop_handle));
}

/// Two buffers on two threads outliving both handles, one of them making a handle of its own.
#[test]
fn buffers_outlive_handles_and_make_new_ones() {
    loom::model(|| {
        let drops = std::sync::Arc::new(AtomicUsize::new(0));
        let a = new_shared(&drops);
        let x = make_buffer(&a);
        let y = make_buffer(&a);
        let (xs, ys) = (x as usize, y as usize);
        let t1 = thread::spawn(move || {
            let again = handle_from_buffer(xs as *const Shared);
            drop_buffer(xs as *const Shared);
            let z = make_buffer(&again);
            drop_handle(again);
            drop_buffer(z);
        });
        let t2 = thread::spawn(move || drop_buffer(ys as *const Shared));
        drop_handle(a);
        t1.join().unwrap();
        t2.join().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1, "freed exactly once, at the end");
    });
}

/// A handle that gives its reference up after unlocking (the protocol before the fix) leaks
/// the state in some interleaving of the first test, and loom finds it: the model can fail.
#[test]
fn a_decrement_after_unlocking_leaks_and_loom_finds_it() {
    /// The handle drop before the fix: the counts looked at under the lock (no buffer, another
    /// handle: not the last), the decrement made after unlocking.
    fn old_drop_handle(handle: Arc<Shared>) {
        let ptr = Arc::into_raw(handle);
        // SAFETY: our reference keeps it alive.
        let shared = unsafe { &*ptr };
        drop(shared.state.lock().unwrap());
        // SAFETY: balances `into_raw`.
        drop(unsafe { Arc::from_raw(ptr) });
    }
    let found = std::panic::catch_unwind(|| loom::model(|| handle_dropped_while_another_allocates(old_drop_handle)));
    let message = match found {
        Ok(()) => String::new(),
        Err(e) => e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    };
    assert!(
        message.contains("never freed") || message.contains("leaked"),
        "loom found no interleaving that leaks: {message:?}"
    );
}
