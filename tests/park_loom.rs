//! Parking (`src/alloc/park.rs`, compiled here with loom's atomics, `Arc` and thread locals,
//! and driven the way `CachingAllocator` drives it: the allocator's side under a mutex) in
//! every interleaving of up to three preemptions. What each model checks:
//!
//! - a parked block is owned by exactly one side at a time: the owner that takes it back or
//!   the pull that frees it, never both (each block's contents are a loom cell that both sides
//!   write, so a handover without a happens-before edge is a data race loom reports), and every
//!   block is freed exactly once;
//! - the last handle closing parking against a thread parking at that moment: the block is
//!   freed once, by the closing pull or by the parker itself, with no pull after;
//! - while recording, what the pull hands the heap is what the heap can take: each logged event
//!   is of a block still allocated there, and a block is freed only after its free was logged;
//! - a thread that exits with a block parked: the block is freed once and its slot goes.
//!
//! Loom treats `SeqCst` loads and stores as acquire and release (its README, "Unsupported
//! features"), and with 0.7.2 a plain store after a race of swaps on one atomic could be read
//! back older than itself by its own thread (an execution C11 forbids). Every write to a parking
//! entry is a swap, which loom orders exactly, and the close's handshake rests on those swaps,
//! not on sequentially consistent loads (see "The last handle" in `park.rs`).

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// What `park.rs` takes from the crate outside the allocator.
mod record {
    /// A recorded allocation's site and step.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct Context {
        pub(crate) site: u32,
        pub(crate) step: u64,
    }

    /// A clock that runs forward on every thread (the pull sorts by it).
    pub(crate) fn raw_ticks() -> u64 {
        static TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        TICKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

// `park.rs`'s `super`: the crate root here, the allocator's module in the library.

/// The allocator's two pools.
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Small = 0,
    Large = 1,
}

mod sync_shim {
    pub(crate) use loom::sync::{atomic, Arc};

    /// loom's `thread_local!`, taking the `const { }` initializer std's takes.
    macro_rules! loom_thread_local {
        ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = const { $init:expr };) => {
            loom::thread_local!($(#[$attr])* $vis static $name: $t = $init);
        };
    }
    pub(crate) use loom_thread_local as thread_local;
}

#[allow(dead_code)]
#[path = "../src/alloc/ids.rs"]
mod ids;

#[allow(dead_code)]
#[path = "../src/alloc/park.rs"]
mod park;

use ids::{BlockId, StreamId};
use park::{BlockClass, Parked, Parking, Pulled, Recording, Took, Unparked};

const ID: u64 = 7;
const BLOCKS: usize = 3;

/// A loom thread with room for a slot built on its stack (the dev profile's frames are large).
fn spawn(f: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
    thread::Builder::new().stack_size(8 << 20).spawn(f).expect("a loom thread")
}

/// Every interleaving with at most three preemptions (loom's advice: bugs need few, and the
/// space of all of them grows too fast to explore).
fn model(f: impl Fn() + Send + Sync + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// The heap's side, behind the allocator's lock.
#[derive(Default)]
struct Heap {
    parking: Parking,
    /// Whether each block is allocated in the heap (a parked block is).
    allocated: [bool; BLOCKS],
    /// Frees per block.
    frees: [u32; BLOCKS],
    /// Logged events applied, as (block, allocation?).
    logged: Vec<(usize, bool)>,
}

/// The allocator: its lock, the last handle's flag, and each block's memory.
struct Alloc {
    heap: Mutex<Heap>,
    closed: AtomicBool,
    memory: [UnsafeCell<u64>; BLOCKS],
}

// SAFETY: the only unsynchronized fields are the blocks' memory cells, whose every access loom
// checks for a happens-before edge (a race fails the test); the rest is loom's atomics and mutex.
unsafe impl Sync for Alloc {}
// SAFETY: as above.
unsafe impl Send for Alloc {}

impl Alloc {
    fn new() -> Arc<Alloc> {
        let heap = Heap { allocated: [true; BLOCKS], ..Heap::default() };
        Arc::new(Alloc {
            heap: Mutex::new(heap),
            closed: AtomicBool::new(false),
            memory: std::array::from_fn(|_| UnsafeCell::new(0)),
        })
    }

    /// The block's owner (a buffer) writes its memory.
    fn use_block(&self, b: usize, v: u64) {
        // SAFETY: a write, checked by loom: a second owner at the same time is a data race.
        self.memory[b].with_mut(|m| unsafe { *m = v });
    }

    /// `Locked::pull`: every parked block back into the heap, which reuses its memory.
    fn pull(&self, heap: &mut Heap) {
        let Heap { parking, allocated, frees, logged } = heap;
        parking.pull(|p| match p {
            Pulled::Logged(e) => {
                let b = e.block.index();
                assert!(allocated[b], "an event logged for block {b}, which the heap has freed");
                logged.push((b, e.alloc.is_some()));
            }
            Pulled::Free(b) => {
                let b = b.index();
                assert!(allocated[b], "block {b} pulled twice");
                allocated[b] = false;
                frees[b] += 1;
                // The heap hands the block out again at once.
                // SAFETY: checked by loom, as above.
                self.memory[b].with_mut(|m| unsafe { *m = 0 });
            }
            Pulled::Settle => {}
        });
    }

    /// A free through the lock (`release_buffer`'s slow path), recorded there unless its free
    /// was logged already.
    fn free_through_lock(&self, b: usize, record: bool) {
        let mut heap = self.heap.lock().unwrap();
        self.pull(&mut heap);
        assert!(heap.allocated[b], "block {b} freed twice");
        heap.allocated[b] = false;
        heap.frees[b] += 1;
        if record {
            heap.logged.push((b, false));
        }
    }

    /// A thread's first free after contention: its slot, listed under the lock, bound to it.
    fn bind(&self) {
        let slot = self.heap.lock().unwrap().parking.register();
        park::bind(ID, slot);
    }

    /// `Buffer::drop` of block `b` on a thread that parks: parked, or freed through the lock.
    fn drop_buffer(&self, b: usize, recorded: bool) {
        match park::park(ID, &self.closed, parked(b), recorded) {
            Ok(()) => {}
            Err(Unparked::LogFull) => panic!("the log holds 256 events"),
            Err(Unparked::No) => self.free_through_lock(b, recorded),
            // Its free is logged already: the heap frees it without recording it again.
            Err(Unparked::Logged) => self.free_through_lock(b, false),
        }
    }
}

fn parked(b: usize) -> Parked {
    Parked {
        block: BlockId::new(b),
        addr: 0x1000 * (b as u64 + 1),
        requested: 512,
        stream: StreamId(0),
        class: BlockClass { size: 512, pool: Pool::Small, oversize: false, reusable: true },
    }
}

/// Every block freed exactly once (`frees`), and none left allocated.
fn freed_once(heap: &Heap, blocks: usize) {
    assert_eq!(&heap.frees[..blocks], &vec![1; blocks][..], "frees per block");
}

/// Runs `owner` on a thread of its own (bound to a slot, as after its first contended free)
/// while this thread runs `here`; returns after the owner ends, with what `here` returned.
fn alongside<R>(owner: impl FnOnce(&Alloc) + Send + 'static, here: impl FnOnce(&Alloc) -> R) -> (Arc<Alloc>, R) {
    let a = Alloc::new();
    let thread = {
        let a = a.clone();
        spawn(move || {
            a.bind();
            owner(&a);
        })
    };
    let r = here(&a);
    thread.join().unwrap();
    (a, r)
}

/// [`alongside`] a pull, as any locked operation makes.
fn against_a_pull(owner: impl FnOnce(&Alloc) + Send + 'static) -> Arc<Alloc> {
    alongside(owner, |a| a.pull(&mut a.heap.lock().unwrap())).0
}

/// One thread parks two blocks, takes the second back, uses it and parks it again, while the
/// allocator pulls; then the allocator pulls what is left.
#[test]
fn a_parked_block_has_one_owner_at_a_time() {
    model(|| {
        let a = against_a_pull(|a| {
            a.use_block(0, 1);
            a.drop_buffer(0, false);
            a.use_block(1, 1);
            a.drop_buffer(1, false);
            if let Took::Block(p) = park::take(ID, StreamId(0), 512, Recording::Off) {
                assert_eq!(p.block.index(), 1, "only the block freed last is taken back");
                a.use_block(1, 2);
                a.drop_buffer(1, false);
            }
        });
        let mut heap = a.heap.lock().unwrap();
        a.pull(&mut heap);
        freed_once(&heap, 2);
    });
}

/// The last handle closes parking and pulls while a thread parks: one of them sees the other,
/// and nothing pulls afterwards.
#[test]
fn closing_parking_frees_a_block_parked_meanwhile_once() {
    model(|| {
        let ready = Arc::new(AtomicBool::new(false));
        let bound = ready.clone();
        let owner = move |a: &Alloc| {
            bound.store(true, Ordering::Release);
            a.use_block(0, 1);
            a.drop_buffer(0, false);
        };
        // `CachingAllocator::drop` of the last handle, once the thread has its slot (with no
        // slot listed, it does not close).
        let (a, closing) = alongside(owner, |a| {
            let closing = ready.load(Ordering::Acquire);
            if closing {
                let mut heap = a.heap.lock().unwrap();
                heap.parking.close(&a.closed);
                a.pull(&mut heap);
            }
            closing
        });
        let mut heap = a.heap.lock().unwrap();
        if !closing {
            // Not closed: the next locked operation pulls.
            a.pull(&mut heap);
        }
        freed_once(&heap, 1);
    });
}

/// While recording: a thread parks a block (logging its free), takes it back from the same
/// site (logging the allocation) and parks it again, while the allocator pulls. The heap sees
/// each event of a block it still holds, and frees the block after its last free is logged.
#[test]
fn a_recorded_round_trip_reaches_the_heap_in_order() {
    model(|| {
        let a = against_a_pull(|a| {
            // Allocated through the lock from this site: a request from here may take back.
            park::remember_site(ID, (1, 2, 0), 5);
            a.use_block(0, 1);
            a.drop_buffer(0, true);
            match park::take(ID, StreamId(0), 512, Recording::Site((1, 2, 0), 3)) {
                Took::Block(p) => {
                    a.use_block(p.block.index(), 2);
                    a.drop_buffer(0, true);
                }
                Took::LogFull => panic!("the log holds 256 events"),
                Took::No => {}
            }
        });
        let mut heap = a.heap.lock().unwrap();
        a.pull(&mut heap);
        freed_once(&heap, 1);
        // Free, then (allocation, free) for each time the thread took it back: alternating, in
        // the thread's order, none lost or doubled.
        let events = &heap.logged;
        assert!(events.len() % 2 == 1, "{events:?}");
        for (i, &(b, alloc)) in events.iter().enumerate() {
            assert_eq!((b, alloc), (0, i % 2 == 1), "{events:?}");
        }
    });
}

/// A thread exits with a block parked (its binding goes with its thread locals) while the
/// allocator pulls: the block is freed once, and the slot, empty and ownerless, goes once the
/// thread has.
#[test]
fn a_gone_threads_block_is_freed_and_its_slot_goes() {
    model(|| {
        let a = against_a_pull(|a| {
            a.use_block(0, 1);
            a.drop_buffer(0, false);
        });
        // loom's `join` returns before the thread's locals are dropped (std's waits for their
        // destructors): pull, as later operations would, until the binding has gone.
        loop {
            let mut heap = a.heap.lock().unwrap();
            a.pull(&mut heap);
            freed_once(&heap, 1);
            if heap.parking.is_empty() {
                break;
            }
            drop(heap);
            thread::yield_now();
        }
    });
}
