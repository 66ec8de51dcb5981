//! Parking: a thread's alloc-free pairs without the allocator's lock.
//!
//! The commonest pattern (a temporary allocated, used and dropped, then the same size again)
//! needs nothing of the heap but the block itself (and, while recording, a history event and
//! a context, below). A dropped buffer's block
//! is *parked* in its thread's slot for the allocator, and a request of the same size on the
//! same stream from that thread *takes* it back: two uncontended atomic swaps on a cache line
//! of that thread's, no lock. Threads allocating on their own no longer queue on one lock.
//!
//! **The heap's view.** A parked block stays allocated in the heap (and counted in the
//! keep-alive protocol's `buffers`), so nothing the heap does can hand it out twice. Every
//! locked operation first *pulls* every parked block back ([`Parking::pull`], through
//! `Shared::lock` and the slow paths), freeing each in the order it was parked, and adds the
//! round trips made since the last pull to the accumulated statistics (one allocation and one
//! free each; the current values and the peaks do not move, since a round trip hands the same
//! block to the same size). So whatever a locked operation reads or changes (statistics,
//! snapshots, the peak, the cache) is exactly what it would be had every parked free reached the
//! heap at once, for every free that happens before it.
//!
//! **The same blocks.** A request takes back only the block its thread freed last, only if it
//! was allocated for exactly the bytes asked for on the same stream and is exactly that request
//! rounded, and only while no free waits for another stream's events: just where the heap's own
//! shortcut for the block freed last would hand out that very block. So on one thread every
//! request gets the block it would get without parking, and the heap's decisions (segments,
//! splits, peaks) are the same. What a trip through the lock would have changed in the
//! heap's state of its stream (its free blocks unsettled, the stream marked as allocating) the
//! pull passes on ([`Trips::streams`]); no locked operation comes between, so it decides
//! alike: `tests/replay.rs` replays every fixture trace both ways and
//! compares every statistic, `tests/invariants.rs` compares the addresses handed out under
//! random operations.
//!
//! **Who writes what.** A slot belongs to one thread, its *owner*, and is listed by the
//! allocator. Only the owner stores a block into an entry, and only into an empty one; anyone
//! (the owner taking it, the allocator pulling it) swaps it out to empty, and whoever's swap
//! returns the block owns it. So an entry the owner sees full is exactly the block it parked
//! there (its size, stream and address kept on the owner's side), or empty. The round-trip
//! counters are written by the owner only, and read by the allocator under its lock.
//!
//! **The last handle.** Parked blocks keep the allocator alive (they count as buffers), so
//! when its last handle goes, the handle's drop closes parking and pulls (under the lock),
//! and a thread that parks after that takes its block back out and frees it through the lock.
//! The two sides are Dekker's: the handle stores `closed` then swaps every entry out, the
//! parker swaps its entry in then reads `closed`. Every write to an entry is a swap, so the
//! entry's writes form one release sequence: if the handle's swap comes first, the parker's
//! swap reads from it and sees `closed`; otherwise the handle's swap takes the block. Either
//! way the block is freed once. (On x86-64 a swap is the instruction a sequentially
//! consistent store is; `tests/park_loom.rs` checks this under loom, which models swaps
//! exactly but sequentially consistent loads only as acquire loads.) An allocation through a
//! handle reopens parking.
//!
//! **Recording.** While the allocator records, a thread logs in its slot what the heap would
//! have recorded: a parked block's free, and a taken-back block's allocation with its new
//! context, each with the clock's raw reading ([`Logged`]; a ring of [`LOG`] events the owner
//! appends to and the pull drains). The pull takes the entries out first, then drains every
//! log and applies the events in time order (each log is in its thread's order; a stable sort
//! merges them): the history event at the time it happened, and the block's context. Then it
//! frees the blocks without recording the free again. The order of the owner's writes makes
//! this exact: a free is logged before its block is parked (so a pull that takes a block out
//! sees its free, through the entry's swap), and an allocation is logged before its buffer
//! exists (so whoever drops it pulls the allocation first); a logged block is still allocated
//! in the heap when its events are applied. A request takes a block back only from the place
//! its thread last allocated from through the lock (the same unwinder trace and scope: the
//! same site, [`SiteKey`]), whose interned site the thread keeps; from anywhere else it goes
//! through the lock, which interns the new site. So one thread's history and contexts are
//! exactly those it would record without parking (`tests/invariants.rs`), and across threads
//! each event is recorded once, each address alternating between allocation and free
//! (`tests/parking.rs`). Events reach the history when a pull merges them: those of one pull
//! are in time order, but a locked operation's own events may precede a thread's earlier ones
//! still in its log. A full log sends its thread to the lock; while another thread holds it
//! (and so pulls), the thread first waits briefly for its log to empty ([`wait_for_room`]).
//!
//! Parking is used for buffers with no tensor description and no other stream recorded
//! (`record_stream`): those need the heap at their free; and not while the history keeps
//! context on frees (the free's capture). And only once a free found the lock held by another
//! thread: one thread alone pays less for a free lock than for parking and pulling later
//! (replays of mixed sizes, where few requests take back the block freed last). A thread whose
//! requests stop matching the block it freed last stops parking until one would have
//! (`Binding::credit`).

use super::ids::{BlockId, StreamId};
// Atomics, `Arc` and thread locals through the shim: `tests/park_loom.rs` compiles this file
// with loom's and checks the protocol above in the interleavings it explores (so the unit tests
// live beside this file, in `park_tests.rs`).
use super::sync_shim::atomic::{
    fence, AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release, Ordering::SeqCst,
};
use super::sync_shim::{thread_local, Arc};
use super::Pool;
use crate::record::Context;
use std::cell::RefCell;
use std::num::NonZeroU32;

/// Blocks a thread keeps parked per allocator: enough for a few temporaries of different
/// sizes alive at once (a matmul's output and its workspace), few enough that a pull is cheap.
pub(crate) const ENTRIES: usize = 4;

/// Events a thread logs for one allocator between two pulls (two a round trip): a full log
/// sends the thread through the lock, whose pull empties every log. 6 KiB a slot; on the H100
/// host 256 made 2 and 4 recording threads 1.1-1.6x one thread's pairs, where 64 made
/// 0.7-1.1x (threads met full logs while another pulled: BENCHMARKS.md).
pub(crate) const LOG: usize = 256;

/// One thread's parked blocks for one allocator, shared by that thread and the allocator.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Each entry: the parked block's id (its slot + 1, so 0 is empty) in the low 32 bits and
    /// the owner's parking sequence number above, so that a pull frees in parking order.
    entries: [AtomicU64; ENTRIES],
    /// Round trips made through this slot, per pool: blocks, their bytes, the bytes asked for.
    /// Written by the owner only.
    trips: [[AtomicU64; 3]; 2],
    /// Round trips of oversize blocks. Written by the owner only.
    oversize_trips: AtomicU64,
    /// The streams (a bit per id) whose blocks made round trips the pull has not yet passed
    /// on ([`Trips::streams`]). The owner sets a bit with a load and a store (no locked
    /// instruction, and only where the load found it clear: once between two pulls); the pull
    /// swaps the word out. Where the two race, bits the pull took may be stored again and
    /// passed on twice: a stream's free blocks noted unsettled once more and its allocating
    /// noted again, which only makes later decisions more careful (asking whether it is idle
    /// before lending its free blocks, waiting longer to take its segments over). On one
    /// thread there is no race, and the heap decides as without parking.
    trip_streams: AtomicU64,
    /// The entry value of the block the owner freed last while it stays parked (0 once taken
    /// or once a later free went through the lock). Written by the owner only.
    last: AtomicU64,
    /// What the owner's round trips recorded, while the allocator records (see "Recording" in
    /// the module docs): a ring of [`LOG`] events, three words each (see [`Logged`]), that the
    /// owner appends to and the pull drains.
    log: [[AtomicU64; 3]; LOG],
    /// Events appended. Written by the owner only, released after the event's words.
    head: AtomicU64,
    /// Events drained. Written by the pull only (under the allocator's lock), released after
    /// it read the events, so that the owner overwrites only what was read.
    tail: AtomicU64,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            entries: Default::default(),
            trips: Default::default(),
            oversize_trips: AtomicU64::new(0),
            trip_streams: AtomicU64::new(0),
            last: AtomicU64::new(0),
            log: std::array::from_fn(|_| Default::default()),
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
        }
    }
}

/// An event a thread logged for a block it parked or took back, applied by the pull in time
/// order: the history event the heap would have recorded (the block's address, size and stream
/// are the heap's), and for a block taken back its new context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Logged {
    pub(crate) block: BlockId,
    /// The raw clock reading (see `record::raw_ticks`) when it happened.
    pub(crate) ticks: u64,
    /// `Some`: the block was taken back by an allocation of this context; `None`: it was freed.
    pub(crate) alloc: Option<Context>,
}

impl Logged {
    fn encode(&self) -> [u64; 3] {
        let site = self.alloc.map_or(0, |c| u64::from(c.site) + 1);
        [u64::from(self.block.raw().get()) | site << 32, self.ticks, self.alloc.map_or(0, |c| c.step)]
    }

    fn decode([w, ticks, step]: [u64; 3]) -> Option<Logged> {
        let block = BlockId::from_raw(NonZeroU32::new(w as u32)?);
        let site = (w >> 32) as u32;
        let alloc = site.checked_sub(1).map(|site| Context { site, step });
        Some(Logged { block, ticks, alloc })
    }
}

impl Slot {
    /// Owner only: adds `n` to a counter nobody else writes (a load and a store, no locked
    /// instruction).
    #[inline]
    fn bump(counter: &AtomicU64, n: u64) {
        counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
    }

    fn trips(&self) -> [[u64; 3]; 2] {
        self.trips.each_ref().map(|p| p.each_ref().map(|c| c.load(Relaxed)))
    }

    /// Owner only: whether the log has room for `n` more events.
    #[inline]
    fn log_room(&self, n: u64) -> bool {
        self.head.load(Relaxed).wrapping_sub(self.tail.load(Acquire)) + n <= LOG as u64
    }

    /// Owner only, after [`log_room`](Self::log_room): appends `e` and publishes it.
    #[inline]
    fn log(&self, e: Logged) {
        let h = self.head.load(Relaxed);
        for (word, v) in self.log[h as usize % LOG].iter().zip(e.encode()) {
            word.store(v, Relaxed);
        }
        self.head.store(h.wrapping_add(1), Release);
    }

    /// Under the allocator's lock: appends every event the owner published to `out`.
    fn drain(&self, out: &mut Vec<Logged>) {
        let head = self.head.load(Acquire);
        let mut t = self.tail.load(Relaxed);
        while t != head {
            let words = self.log[t as usize % LOG].each_ref().map(|w| w.load(Relaxed));
            out.extend(Logged::decode(words));
            t = t.wrapping_add(1);
        }
        self.tail.store(head, Release);
    }
}

/// What the owner knows of a block it parked (the heap knows it too; this is the owner's copy,
/// to match requests and make buffers without the lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parked {
    pub(crate) block: BlockId,
    pub(crate) addr: u64,
    /// The bytes asked for: a request takes a parked block only for exactly these, so the
    /// heap's record of the block (requested bytes included) stays true.
    pub(crate) requested: u64,
    pub(crate) stream: StreamId,
    /// The block's size, pool and oversize flag, for the statistics of the round trips.
    pub(crate) class: BlockClass,
}

/// A block's size and what it counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockClass {
    pub(crate) size: u64,
    pub(crate) pool: Pool,
    pub(crate) oversize: bool,
    /// Whether the block is exactly its request rounded (no remainder too small to split was
    /// left with it): only such a block may be taken back as it lies, as the heap's own
    /// shortcut for the block freed last would.
    pub(crate) reusable: bool,
}

/// The allocator's side (behind its lock): every slot of every thread that parked, with what
/// of its round trips the statistics already hold.
#[derive(Debug, Default)]
pub(crate) struct Parking {
    slots: Vec<Listed>,
    /// The pull's events, kept for their allocation.
    events: Vec<Logged>,
    /// Set by [`close`](Parking::close): the next pull swaps every entry out, empty or not.
    closing: bool,
}

#[derive(Debug)]
struct Listed {
    slot: Arc<Slot>,
    merged: [[u64; 3]; 2],
    merged_oversize: u64,
    /// During a pull: the blocks taken out of the entries, and how many.
    taken: [(u64, BlockId); ENTRIES],
    n: usize,
    /// During a pull: the owner had gone before it began, so nothing will be parked here again.
    gone: bool,
}

/// What a pull asks of the heap, in order: first every logged event, in time order, then the
/// frees and merges of each slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pulled {
    /// Record what a thread did with a block it parked or took back (the block is still
    /// allocated in the heap when this comes).
    Logged(Logged),
    /// Free this block, as the owner's drop would have, without recording the free: it is
    /// in the owner's log where anything was recorded.
    Free(BlockId),
    /// Merge the block freed last (`Heap::settle`): the owner freed something after it.
    Settle,
}

/// Round trips made since the last pull, for the statistics: per pool, blocks, bytes and bytes
/// requested, and oversize blocks; and the streams that made them, by bit, for what the heap
/// keeps per stream (`Heap::note_round_trips`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trips {
    pub(crate) pools: [[u64; 3]; 2],
    pub(crate) oversize: u64,
    pub(crate) streams: u64,
}

impl Parking {
    /// Lists a new slot for the calling thread, which [`bind`]s it after the lock is released.
    pub(crate) fn register(&mut self) -> Arc<Slot> {
        let slot = Arc::new(Slot::default());
        self.slots.push(Listed {
            slot: Arc::clone(&slot),
            merged: [[0; 3]; 2],
            merged_oversize: 0,
            taken: [(0, BlockId::new(0)); ENTRIES],
            n: 0,
            gone: false,
        });
        slot
    }

    /// The last handle's half of the close (see "The last handle" in the module docs): sets
    /// `closed`; the pull that follows, under the same lock, swaps out every entry.
    pub(crate) fn close(&mut self, closed: &AtomicBool) {
        closed.store(true, SeqCst);
        self.closing = true;
    }

    /// Whether any thread ever parked here (the pull has nothing to do otherwise).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Takes every parked block out, freeing each in parking order per thread (through `heap`),
    /// after recording what the threads logged (in time order), and returns the round trips
    /// made since the last pull. Slots whose thread has gone (or unbound them) are dropped once
    /// empty.
    ///
    /// The heap ends as if each thread's frees had reached it when they happened: a free
    /// merges the block freed before it (the heap keeps only the block freed last unmerged, for
    /// a request of its size), so a thread that parked anything first merges what the heap held
    /// unmerged, and the last block pulled stays unmerged only if it is still the one its thread
    /// freed last (none was taken back or freed through the lock since).
    pub(crate) fn pull(&mut self, mut heap: impl FnMut(Pulled)) -> Trips {
        // The entries first, then the logs: an owner logs a free before it parks the block, so
        // every block taken out here comes with its logged events.
        for listed in &mut self.slots {
            // An owner gone before the pull began has written all it will: its slot goes after.
            listed.gone = Arc::strong_count(&listed.slot) == 1;
            if listed.gone {
                // Pairs with the release of the owner's reference: its last writes are seen.
                fence(Acquire);
            }
            let slot = &*listed.slot;
            listed.n = 0;
            for e in &slot.entries {
                // A load first, to spare an empty entry's cache line a locked write; the
                // closing pull swaps each (see the module docs).
                if self.closing || e.load(SeqCst) != 0 {
                    if let Some(b) = decode(e.swap(0, SeqCst)) {
                        listed.taken[listed.n] = b;
                        listed.n += 1;
                    }
                }
            }
            listed.taken[..listed.n].sort_unstable_by_key(|&(seq, _)| seq);
        }
        self.closing = false;
        self.events.clear();
        let mut logs = 0;
        for listed in &self.slots {
            let before = self.events.len();
            listed.slot.drain(&mut self.events);
            logs += usize::from(self.events.len() > before);
        }
        if logs > 1 {
            // Each log is in time order already: the (stable) sort merges them, keeping a
            // thread's events of one tick in its order.
            self.events.sort_by_key(|e| e.ticks);
        }
        for &e in &self.events {
            heap(Pulled::Logged(e));
        }
        let mut trips = Trips::default();
        for listed in &mut self.slots {
            let slot = &*listed.slot;
            let taken = &listed.taken[..listed.n];
            let now = slot.trips();
            let active = !taken.is_empty() || now != listed.merged;
            if active {
                heap(Pulled::Settle);
            }
            for &(_, b) in taken {
                heap(Pulled::Free(b));
            }
            if active && decode(slot.last.load(Relaxed)) != taken.last().copied() {
                heap(Pulled::Settle);
            }
            for (pool, counts) in now.iter().enumerate() {
                for (k, &c) in counts.iter().enumerate() {
                    trips.pools[pool][k] += c.wrapping_sub(listed.merged[pool][k]);
                }
            }
            listed.merged = now;
            let over = slot.oversize_trips.load(Relaxed);
            trips.oversize += over.wrapping_sub(listed.merged_oversize);
            listed.merged_oversize = over;
            if slot.trip_streams.load(Relaxed) != 0 {
                trips.streams |= slot.trip_streams.swap(0, Relaxed);
            }
        }
        // A slot whose owner had gone before the pull has no one to park in it again: just
        // emptied, it goes. (One that went during the pull is emptied by the next.)
        self.slots.retain(|l| !l.gone);
        trips
    }
}

/// The entry value for block `b` parked as the owner's `seq`-th.
fn encode(b: BlockId, seq: u32) -> u64 {
    u64::from(seq) << 32 | u64::from(b.raw().get())
}

/// The sequence number and block of an entry value; `None` for an empty entry.
fn decode(v: u64) -> Option<(u64, BlockId)> {
    let raw = NonZeroU32::new(v as u32)?;
    Some((v >> 32, BlockId::from_raw(raw)))
}

/// A thread's slot for one allocator, with its copy of what it parked.
struct Binding {
    allocator: u64,
    slot: Arc<Slot>,
    parked: [Option<Parked>; ENTRIES],
    /// The entry of the block this thread freed last, while it is parked: the only one a
    /// request may take (the heap would have merged the others already, at the next free).
    last: Option<usize>,
    /// Parking sequence numbers, for the pull's order (wrapping: a pull sees at most
    /// [`ENTRIES`] of them, parked in a row).
    seq: u32,
    /// Parks left before parking pays off or stops: a block taken back (or a request that
    /// would have taken one) sets it to [`CREDIT`]; each park spends one. A thread whose
    /// requests rarely match the block it freed last (a replay of many sizes) frees through
    /// the lock, as parking would only delay its frees to the next pull at extra cost.
    credit: u32,
    /// While parking is off for lack of credit: the request (bytes, stream) that would have
    /// taken back the block freed last, had it been parked.
    ghost: Option<(u64, StreamId)>,
    /// While the allocator records: the site this thread's last allocation through the lock
    /// was interned as, with its key (see [`SiteKey`]). A request from the same place takes
    /// a block back with that site; from anywhere else it goes through the lock.
    site: Option<(SiteKey, u32)>,
}

/// What identifies a capture's site on its thread without the allocator's tables: the
/// unwinder's trace version and the stack's length (the same frames, see
/// `record::Pending::site_key`) and the scope.
pub(crate) type SiteKey = (u64, usize, u32);

/// What an allocation records, for [`take`]: nothing, or the key of its site and its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recording {
    /// Nothing is recorded.
    Off,
    /// A context is recorded: the capture's site key and step.
    Site(SiteKey, u64),
}

impl Binding {
    /// Which entry holds the block this thread freed last (`None`: none does), on its side
    /// and in the slot, where the pull reads it.
    #[inline]
    fn set_last(&mut self, entry: Option<usize>) {
        self.last = entry;
        let v = entry.and_then(|i| self.parked[i]).map_or(0, |p| encode(p.block, self.seq));
        self.slot.last.store(v, Relaxed);
    }
}

/// See `Binding::credit`.
pub(crate) const CREDIT: u32 = 16;

/// Bindings a thread keeps at once; beyond this the least recently used is dropped (its parked
/// blocks stay in its slot until the allocator pulls them, and the slot then goes).
const MAX_BINDINGS: usize = 8;

thread_local! {
    /// This thread's slots, the allocator used last first.
    static BINDINGS: RefCell<Vec<Binding>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's binding for `allocator`, if it has one and thread-local storage
/// is usable (not while the thread's locals are being destroyed, not re-entered).
#[inline]
fn with_binding<R>(allocator: u64, f: impl FnOnce(&mut Binding) -> Option<R>) -> Option<R> {
    BINDINGS
        .try_with(|b| {
            let mut b = b.try_borrow_mut().ok()?;
            let i = b.iter().position(|x| x.allocator == allocator)?;
            if i != 0 {
                b.swap(0, i);
            }
            f(&mut b[0])
        })
        .ok()
        .flatten()
}

/// Whether this thread has a slot for `allocator`.
pub(crate) fn is_bound(allocator: u64) -> bool {
    with_binding(allocator, |_| Some(())).is_some()
}

/// Binds `slot` (from [`Parking::register`]) to this thread for `allocator`.
pub(crate) fn bind(allocator: u64, slot: Arc<Slot>) {
    let _ = BINDINGS.try_with(|b| {
        let Ok(mut b) = b.try_borrow_mut() else { return };
        // Slots of allocators that are gone (the list dropped them) first, then the least
        // recently used.
        b.retain(|x| Arc::strong_count(&x.slot) > 1);
        if b.len() >= MAX_BINDINGS {
            b.pop();
        }
        b.insert(
            0,
            Binding {
                allocator,
                slot,
                parked: [None; ENTRIES],
                last: None,
                seq: 0,
                credit: CREDIT,
                ghost: None,
                site: None,
            },
        );
    });
}

/// Takes back the block this thread freed last for `allocator` if it is still parked and was
/// allocated for exactly `requested` bytes on `stream`, counting the round trip; where the
/// allocator records, only for a request from the site this thread last allocated from
/// through the lock (`recording`), logging the allocation.
///
/// Only the block freed last, and only as the heap's shortcut for it would reuse it (the
/// same stream, a block of exactly the request's rounded size): so a thread's requests get the
/// very blocks they would get without parking, and the heap's decisions (and the peaks they
/// lead to) do not change. The other parked blocks only wait for the next pull.
#[inline]
pub(crate) fn take(allocator: u64, stream: StreamId, requested: u64, recording: Recording) -> Took {
    with_binding(allocator, |b| {
        let Some(i) = b.last else {
            if b.ghost.take() == Some((requested, stream)) {
                // Parked, the block freed last would have been taken back: park again.
                b.credit = CREDIT;
            }
            return None;
        };
        let p = b.parked[i].as_ref()?;
        if p.requested != requested || p.stream != stream || !p.class.reusable {
            return None;
        }
        // The stream's bit, for `Trips::streams`; a stream past the 64th goes through the lock.
        let bit = 1u64.checked_shl(stream.0)?;
        b.credit = CREDIT;
        let ctx = match recording {
            Recording::Off => None,
            Recording::Site(key, step) => match b.site {
                Some((k, site)) if k == key => {
                    if !b.slot.log_room(1) {
                        return Some(Took::LogFull);
                    }
                    Some(Context { site, step })
                }
                // Through the lock, which interns the site.
                _ => return None,
            },
        };
        b.set_last(None);
        let p = b.parked[i].take()?;
        // Whoever swaps the block out owns it: the allocator may have pulled it just now.
        decode(b.slot.entries[i].swap(0, SeqCst))?;
        let s = &b.slot;
        if ctx.is_some() {
            // Before the buffer exists: whoever drops it pulls this first.
            s.log(Logged { block: p.block, ticks: crate::record::raw_ticks(), alloc: ctx });
        }
        let t = &s.trips[p.class.pool as usize];
        Slot::bump(&t[0], 1);
        Slot::bump(&t[1], p.class.size);
        Slot::bump(&t[2], p.requested);
        if p.class.oversize {
            Slot::bump(&s.oversize_trips, 1);
        }
        let streams = s.trip_streams.load(Relaxed);
        if streams & bit == 0 {
            s.trip_streams.store(streams | bit, Relaxed);
        }
        Some(Took::Block(p))
    })
    .unwrap_or(Took::No)
}

/// What [`take`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Took {
    /// The block, taken back.
    Block(Parked),
    /// It would have taken a block back, but the log is full (a guard: [`park`] keeps room for
    /// the allocation that takes its block back).
    LogFull,
    /// Nothing: the request goes through the lock.
    No,
}

/// Waits a little for the allocator to empty this thread's log for `allocator` (call when a
/// lock holder, which pulls, was seen: a free whose park found the log full): whether it has
/// room for `n` events now. Every locked
/// operation pulls first, so a thread whose log filled while another held the lock finds it
/// emptied a moment later, instead of queueing for the lock only to pull an empty log.
pub(crate) fn wait_for_room(allocator: u64, n: u64) -> bool {
    let Some(slot) = with_binding(allocator, |b| Some(Arc::clone(&b.slot))) else { return false };
    for i in 0..ROOM_SPINS {
        if slot.log_room(n) {
            return true;
        }
        if i % 64 == 63 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    slot.log_room(n)
}

/// How long [`wait_for_room`] waits: about as long as a pull of every thread's full log.
const ROOM_SPINS: u32 = 4096;

/// This thread allocated from the site of `key` through the lock while `allocator` records,
/// and it was interned as `site`: a request from there may take a block back with it.
#[inline]
pub(crate) fn remember_site(allocator: u64, key: SiteKey, site: u32) {
    with_binding(allocator, |b| {
        b.site = Some((key, site));
        Some(())
    });
}

/// This thread freed a block of `allocator` through the lock: the block it parked before is no
/// longer the one it freed last, so it may not be taken back (the heap merged it at that free).
#[inline]
pub(crate) fn forget_last(allocator: u64) {
    with_binding(allocator, |b| {
        b.ghost = None;
        if b.last.is_some() {
            b.set_last(None);
        }
        Some(())
    });
}

/// Why a block was not parked: the caller frees it through the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unparked {
    /// Nothing of it was logged.
    No,
    /// Its free is logged already (parking closed just after): the free through the lock must
    /// not record it again.
    Logged,
    /// The log is full: see [`wait_for_room`].
    LogFull,
}

/// Parks `p` in this thread's slot for `allocator`, logging its free where `recorded` (the
/// allocator records: see the module docs). `Err` when it cannot (no slot, every entry full,
/// the log full, or parking closed): the caller frees the block through the lock.
#[inline]
pub(crate) fn park(allocator: u64, closed: &AtomicBool, p: Parked, recorded: bool) -> Result<(), Unparked> {
    let parked = with_binding(allocator, |b| {
        // Whatever happens, this is now the block freed last: a parked one no longer is.
        b.set_last(None);
        if b.credit == 0 {
            b.ghost = p.class.reusable.then_some((p.requested, p.stream));
            return None;
        }
        // An entry the owner thinks full but finds empty was pulled: it is free again.
        let i = (0..ENTRIES).find(|&i| b.parked[i].is_none() || b.slot.entries[i].load(Relaxed) == 0)?;
        // Room for this free and the allocation that takes the block back.
        if recorded && !b.slot.log_room(2) {
            return Some(Err(Unparked::LogFull));
        }
        b.credit -= 1;
        b.seq = b.seq.wrapping_add(1);
        if recorded {
            // Before the entry: a pull that takes the block out sees its free logged.
            b.slot.log(Logged { block: p.block, ticks: crate::record::raw_ticks(), alloc: None });
        }
        let e = &b.slot.entries[i];
        // A swap, then a load: Dekker's half (module docs). The swap finds the entry empty.
        let was = e.swap(encode(p.block, b.seq), SeqCst);
        debug_assert_eq!(was, 0, "parked over another block");
        if closed.load(SeqCst) {
            b.parked[i] = None;
            // The last handle is going: take the block back (unless its pull already did, and
            // freed it) and free it through the lock.
            return Some(if decode(e.swap(0, SeqCst)).is_none() { Ok(()) } else { Err(Unparked::Logged) });
        }
        b.parked[i] = Some(p);
        b.set_last(Some(i));
        Some(Ok(()))
    });
    match parked {
        Some(Ok(())) => Ok(()),
        Some(Err(u)) if recorded => Err(u),
        _ => Err(Unparked::No),
    }
}
