//! Loading a file, whether it is read or refused, leaves no memory behind: counted by a
//! counting global allocator, not by resident memory. (A process of its own, one test: the
//! allocator counts the whole process. It is this binary's global allocator, which only counts.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use vramscope::Snapshot;

#[path = "../common/hostile.rs"]
mod hostile;

struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is forwarded to `System` unchanged; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract for `layout` is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout` (through `alloc` above).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as for `dealloc` and `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn twenty_thousand_loads_leak_nothing() {
    if crate::in_child(module_path!(), "twenty_thousand_loads_leak_nothing") {
        return;
    }
    let real =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/torch/leaky_train.snapshot.pickle")).unwrap();
    let cycle = hostile::cycle();
    let unreachable = hostile::unreachable_cycle();
    let bomb = hostile::block_bomb(20_000);
    let frames = hostile::frame_bomb(20_000);
    let load = |data: &[u8]| drop(Snapshot::from_bytes(data, "leak check"));
    // Warm up whatever is created once (lazy statics, thread-locals).
    for data in [&real[..], &cycle, &unreachable, &bomb, &frames] {
        load(data);
    }
    let before = LIVE.load(Ordering::Relaxed);
    for _ in 0..20_000 {
        load(&cycle);
        load(&unreachable);
    }
    for _ in 0..20 {
        load(&bomb);
        load(&frames);
        load(&real);
    }
    let after = LIVE.load(Ordering::Relaxed);
    assert_eq!(after - before, 0, "{} bytes leaked", after - before);
}
