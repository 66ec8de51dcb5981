//! Stream ordering: the streams an allocator knows, the blocks that wait for other streams'
//! events before reuse (`record_stream`), and completing those waits.

use super::accounting::Note;
use super::*;
use crate::alloc::ids::{stream_bit, streams_in};

#[derive(Debug, Clone, Copy)]
pub(super) struct PendingEvent {
    pub(super) event: RawEvent,
    pub(super) block: BlockId,
    /// The stream the event was recorded on.
    pub(super) stream: StreamId,
    /// [`Heap::event_mark`] when it was recorded: a wait for its stream that began later has
    /// passed it.
    pub(super) seq: u64,
    /// How often the backend said the event was not done yet.
    pub(super) asked: u32,
}

/// A stream as the allocator knows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamSlot {
    pub(crate) raw: RawStream,
    /// [`Streams::grows`] at the stream's last allocation.
    pub(crate) last_alloc: u64,
    /// Live segments the stream holds, small pool and large (kept by [`Heap::count_segment`]).
    pub(crate) segments: [u32; 2],
    /// Of those, the ones reserved with room to grow in place ([`Segment::growable`], kept
    /// by [`Heap::count_segment`]).
    pub(crate) growable: u32,
    /// Whether the stream borrowed a small block while it held no small segment (see
    /// [`Heap::may_borrow`]).
    pub(crate) borrowed_small: bool,
    /// [`Streams::frees`] when memory last joined the stream's free blocks (a block freed, or a
    /// segment moved to it).
    pub(crate) freed_at: u64,
    /// [`Streams::frees`] when the stream was last seen idle ([`Heap::idle`]).
    pub(crate) idle_at: u64,
    /// What the backend said when last asked whether the stream was idle (false before it
    /// was first asked): where it said idle, the stream's loans go back unasked
    /// ([`Heap::hand_back`]).
    pub(crate) last_idle: bool,
    /// The streams (by bit, [`stream_bit`]) with loans given back unasked into this stream's
    /// free blocks, not yet asked about ([`Heap::hand_back`], [`Heap::find_checked`]).
    pub(crate) owed_by: u64,
}

impl StreamSlot {
    pub(crate) fn new(raw: RawStream) -> Self {
        StreamSlot {
            raw,
            last_alloc: 0,
            segments: [0; 2],
            growable: 0,
            borrowed_small: false,
            freed_at: 0,
            idle_at: 0,
            last_idle: false,
            owed_by: 0,
        }
    }

    /// Whether no memory joined the stream's free blocks since it was last seen idle: then no
    /// work it queued can still touch any of them (each was queued before its block was freed,
    /// or ordered before the stream's by [`Heap::take_over`]), though the stream may be busy
    /// with its live blocks now. Memory it never used counts as seen idle.
    pub(crate) fn free_blocks_settled(&self) -> bool {
        self.freed_at <= self.idle_at
    }
}

/// The streams an allocator knows and what is remembered about them: the frees waiting for
/// their events, the clock that tells idle ones, the home stream, the segments offered for
/// adoption and the loans given back unasked. Its fields are private to this file: the rules
/// that change them are here, and the rest of the heap reads them or calls the methods below.
#[derive(Debug)]
pub(super) struct Streams {
    slots: Vec<StreamSlot>,
    pending: Vec<PendingEvent>,
    /// Events recorded for pending frees so far ([`Heap::event_mark`]).
    events_recorded: u64,
    /// Requests that found no cached block (segments reserved or adopted): the clock that
    /// tells idle streams.
    grows: u64,
    /// The stream whose memory serves other streams' large requests while it is idle (see
    /// [`Heap::serve_from_range`]; kept by [`Heap::track_home`]).
    home: Option<StreamId>,
    /// Live segments reserved with room to grow in place, of every stream
    /// ([`StreamSlot::growable`] summed; kept by [`Heap::count_segment`]).
    growable: u32,
    /// Whole free segments of streams found idle at the last sweep, for other streams to adopt
    /// before the next; see [`Heap::release_idle`].
    adoptable: Vec<BlockId>,
    /// Memory that joined a stream's free blocks so far, counted (see
    /// [`StreamSlot::free_blocks_settled`]).
    frees: u64,
    /// The streams (by bit, ids below 64) that gave back loans without being asked whether
    /// they were idle, not yet checked ([`Heap::check_returns`]).
    unchecked: u64,
    /// Those loans (their owners are ordered after a borrower found busy; kept out of use if
    /// it can be neither waited for nor synchronized; see [`Heap::check_returns`]).
    unchecked_loans: Vec<UncheckedLoan>,
}

impl std::ops::Index<usize> for Streams {
    type Output = StreamSlot;
    #[inline]
    fn index(&self, i: usize) -> &StreamSlot {
        &self.slots[i]
    }
}

impl Streams {
    /// The default stream (raw stream 0) only.
    pub(super) fn new() -> Self {
        Streams {
            slots: vec![StreamSlot::new(0)],
            pending: Vec::new(),
            events_recorded: 0,
            grows: 0,
            home: None,
            growable: 0,
            adoptable: Vec::new(),
            frees: 0,
            unchecked: 0,
            unchecked_loans: Vec::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn iter(&self) -> std::slice::Iter<'_, StreamSlot> {
        self.slots.iter()
    }

    /// Whether frees wait for events.
    #[inline]
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The events frees wait for, handed over (at the allocator's end).
    pub(super) fn take_pending(&mut self) -> Vec<PendingEvent> {
        std::mem::take(&mut self.pending)
    }

    /// Block `block`'s free waits for `event`, recorded on `stream`.
    #[inline]
    pub(super) fn wait_for(&mut self, event: RawEvent, block: BlockId, stream: StreamId) {
        let seq = self.events_recorded;
        self.events_recorded += 1;
        self.pending.push(PendingEvent { event, block, stream, seq, asked: 0 });
    }

    /// Whether loans went back unasked and their borrowers are not yet checked.
    #[inline]
    pub(super) fn any_unchecked(&self) -> bool {
        self.unchecked != 0
    }

    /// Stream `s` allocates now (the idle clock's reading).
    #[inline]
    pub(super) fn mark_allocating(&mut self, s: StreamId) {
        self.slots[s.index()].last_alloc = self.grows;
    }

    /// Memory that work queued on `stream` may still use joins its free blocks: they are no
    /// longer settled ([`StreamSlot::free_blocks_settled`]) until it is next seen idle.
    #[inline]
    pub(super) fn note_freed(&mut self, stream: StreamId) {
        self.frees += 1;
        self.slots[stream.index()].freed_at = self.frees;
    }

    /// A request found no cached block: the idle clock ticks. True when it is time to sweep
    /// the idle streams' segments ([`Heap::release_idle`]).
    #[inline]
    pub(super) fn grew(&mut self) -> bool {
        self.grows += 1;
        self.grows.is_multiple_of(IDLE_GROWS)
    }

    /// Live segments with room to grow in place, of every stream.
    pub(super) fn growable(&self) -> u32 {
        self.growable
    }

    /// The home stream ([`Heap::track_home`]).
    pub(super) fn home(&self) -> Option<StreamId> {
        self.home
    }

    /// The streams (by bit) with loans given back unasked, and those loans.
    pub(super) fn unchecked(&self) -> (u64, &[UncheckedLoan]) {
        (self.unchecked, &self.unchecked_loans)
    }
}

/// How many of the idle streams' segments offered last [`Heap::adopt`] looks at.
const LOOK: usize = 8;

/// How many loans may go back unasked before the next is asked about at its free
/// ([`Heap::hand_back`]): a bound on [`Streams::unchecked_loans`].
const MAX_UNCHECKED: usize = 256;

/// A loan given back unasked ([`Heap::hand_back`]), until its borrower is checked
/// ([`Heap::check_returns`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct UncheckedLoan {
    pub(super) borrower: StreamId,
    /// The stream whose free blocks took it back (the block's, which may differ from its
    /// segment's).
    pub(super) owner: StreamId,
    pub(super) segment: SegmentId,
    pub(super) addr: u64,
    pub(super) size: u64,
}

impl Heap {
    /// Completes the pending frees whose events are done. Never blocks.
    ///
    /// An event the backend still calls not done on its 4th, 8th, 16th, ... query is checked
    /// against its stream: a stream with no work queued has done the work recorded before the
    /// event (`cuStreamQuery` on CUDA), whatever the event query says. On an H200 (driver
    /// 580.159.04) `cuEventQuery` said "not ready" for an event whose stream was idle and whose
    /// work had visibly landed, in about one run in ten of the CUDA suite, sometimes still a
    /// millisecond later (BENCHMARKS.md, "An event query that lags"); without this such a block
    /// stayed out of use until its stream was synchronized. The backoff keeps the stream
    /// queries to a few per event.
    pub(crate) fn process_pending(&mut self, backend: &dyn Backend) {
        self.complete_waited(backend, 0, |_| false);
    }

    pub(super) fn event_done(&mut self, block: BlockId) {
        let b = &mut self.blocks[block];
        b.pending_events -= 1;
        // A stranded block stays out of use whatever its other streams' events say.
        if b.pending_events == 0 && b.state == BlockState::PendingFree {
            let (addr, requested, stream) = (b.addr, b.requested, b.stream);
            // The other streams' work is done; the block's own stream's may not be (it was
            // queued before the free), so its free blocks are unsettled from here.
            self.streams.note_freed(stream);
            self.note(Note::WaitOver { addr, requested, stream });
            self.finish_free(block);
        }
    }

    /// Waits for the streams that pending frees wait on, then completes them.
    pub(crate) fn synchronize_pending(&mut self, backend: &dyn Backend) {
        if !self.streams.has_pending() {
            return;
        }
        self.note(Note::SyncAllStreams);
        let mark = self.event_mark();
        let mut waited = vec![true; self.streams.slots.len()];
        for (s, done) in waited.iter_mut().enumerate() {
            if let Err(e) = backend.synchronize(self.streams.slots[s].raw) {
                *done = false;
                self.note(Note::BackendError);
                self.accounting.keep_error(format!("synchronizing a stream: {e}"));
            }
        }
        self.complete_waited(backend, mark, |s| waited[s.index()]);
    }

    /// The count of events recorded so far: take it before waiting for a stream (outside
    /// the lock), and [`Heap::synchronized`] completes the frees that waited on events the
    /// wait has passed.
    pub(crate) fn event_mark(&self) -> u64 {
        self.streams.events_recorded
    }

    /// The host waited for `stream` (every stream where `None`), the wait having begun after
    /// [`Heap::event_mark`] returned `mark`: completes the frees that waited on events recorded
    /// on it before `mark`, without asking the backend (they are done: each was recorded on
    /// the stream before the wait began), then those whose events the backend says are done.
    /// Completing them from the wait rather than the query makes `synchronize` keep its
    /// promise whatever the event query says: on an H200 `cuEventQuery` said "not ready" after
    /// `cuStreamSynchronize` of the event's stream (BENCHMARKS.md, "An event query that lags").
    pub(crate) fn synchronized(&mut self, backend: &dyn Backend, stream: Option<StreamId>, mark: u64) {
        self.complete_waited(backend, mark, |s| stream.is_none_or(|w| w == s));
    }

    /// Completes the pending frees whose events were recorded before `mark` on a stream
    /// `waited` says the host waited for, and those whose events the backend says are done
    /// (see [`Heap::process_pending`]).
    fn complete_waited(&mut self, backend: &dyn Backend, mark: u64, waited: impl Fn(StreamId) -> bool) {
        let mut k = 0;
        while k < self.streams.pending.len() {
            let p = self.streams.pending[k];
            let done = if p.seq < mark && waited(p.stream) {
                true
            } else {
                match backend.event_completed(p.event) {
                    Ok(true) => true,
                    Ok(false) => {
                        let asked = p.asked + 1;
                        self.streams.pending[k].asked = asked;
                        asked >= 4 && asked.is_power_of_two() && self.idle(backend, p.stream)
                    }
                    Err(e) => {
                        self.note(Note::BackendError);
                        self.accounting.keep_error(format!("querying an event: {e}"));
                        false
                    }
                }
            };
            if done {
                backend.destroy_event(p.event);
                self.streams.pending.swap_remove(k);
                self.event_done(p.block);
            } else {
                k += 1;
            }
        }
    }

    /// Whether frees wait for other streams' events.
    pub(crate) fn has_pending(&self) -> bool {
        self.streams.has_pending()
    }

    /// Adds `stream` to the streams block `i` is used on.
    pub(crate) fn record_stream(&mut self, i: BlockId, stream: StreamId) {
        if self.blocks[i].stream != stream {
            let uses = &mut self.extra_mut(i).uses;
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        } else if let Some(e) = self.blocks[i].extra.as_mut().filter(|e| e.lent_to.is_some_and(|to| to != stream)) {
            // A loan used on its owner's stream: nothing to wait for before the owner reuses
            // it, but its owner's free blocks are not settled by its return (`hand_back`).
            e.used_by_owner = true;
        }
    }

    /// Over the soft limit, where the request's stream has no free block that fits: the best
    /// fit for `size` bytes in `pool` among the free blocks of the other streams' segments
    /// (those of the streams holding free blocks only), with `stream`'s work ordered after the
    /// owner's (`Backend::order_after`, as for a segment taken over) so that nothing the owner
    /// queued before freeing it can still touch the memory. The block stays in its owner's
    /// segment; at its free, [`Heap::hand_back`] gives it back (ordering the owner after
    /// `stream` where `stream` has work queued; see [`Heap::lend`]). Without this, the reclaim
    /// releases cached segments and reserves a new one of the request's size while other
    /// streams cache free blocks that fit: with dynamic shapes on several streams, two backend
    /// calls on step after step. `None` if no other stream's free block fits or its owner
    /// could not be waited for.
    pub(super) fn lendable(
        &mut self,
        backend: &dyn Backend,
        pool: Pool,
        stream: StreamId,
        size: u64,
    ) -> Option<BlockId> {
        let mut best: Option<((u64, u64), BlockId)> = None;
        for &s in self.free.occupied(pool as usize) {
            if s == stream.0 {
                continue;
            }
            // Only over the soft limit: PyTorch's oversize rules give way (`Heap::keeps_oversize`).
            if let Some(b) = self.find_free(pool, StreamId(s), size, false) {
                // The smallest, and among equals the lowest order key: the same whatever the
                // order of the streams, and wherever the backend put the segments.
                let found = (self.blocks[b].size, self.order_key(b));
                if best.is_none_or(|(at, _)| found < at) {
                    best = Some((found, b));
                }
            }
        }
        let (_, b) = best?;
        let owner = self.blocks[b].stream;
        self.order_streams(backend, stream, owner, "to borrow a free block of its segment").then_some(b)
    }

    /// Whether a request of `stream` in `pool` may borrow another stream's free block. A large
    /// one may; a small one where the stream holds a small segment, or the first time it holds
    /// none. A stream that holds no small segment and must borrow again keeps allocating: lent
    /// every block it ever uses, each request and free would order two streams under the lock
    /// and none could be taken back without it (see `park`), as threads each allocating on a
    /// stream of their own did (1 M pairs a second at 16 threads against 40 M on one stream);
    /// it reserves a 2 MiB segment of its own instead. A stream made for one request (a stream
    /// per request) still borrows rather than reserve a segment each.
    ///
    /// A small request's first try counts whether or not a block is then lent: where none is,
    /// the stream reserves a small segment of its own right after, and holding one it may
    /// borrow again.
    fn may_borrow(&mut self, stream: StreamId, pool: Pool) -> bool {
        let slot = &mut self.streams.slots[stream.index()];
        if pool == Pool::Large || slot.segments[Pool::Small as usize] > 0 {
            return true;
        }
        !std::mem::replace(&mut slot.borrowed_small, true)
    }

    /// Over the limit, a free block of another stream lent to a request of `size` bytes in
    /// `pool` on `stream` ([`Heap::lendable`]), where [`Heap::may_borrow`] lets it borrow.
    pub(super) fn borrow(&mut self, backend: &dyn Backend, pool: Pool, stream: StreamId, size: u64) -> Option<Grown> {
        if !self.may_borrow(stream, pool) {
            return None;
        }
        self.settle();
        self.lendable(backend, pool, stream, size).map(Grown::Lent)
    }

    /// Block `i`, of another stream's segment, is handed out to `stream` (`from_range`: by
    /// [`Heap::serve_from_range`]): `stream` counts as a stream the block is used on (as after
    /// `record_stream`), so that its free goes back to the owner at once where `stream` is
    /// idle, else orders the owner after `stream` or waits for an event on `stream`
    /// ([`Heap::hand_back`]); its allocation and free are recorded on `stream`.
    pub(super) fn lend(&mut self, i: BlockId, stream: StreamId, from_range: bool) {
        self.record_stream(i, stream);
        let extra = self.extra_mut(i);
        extra.lent_to = Some(stream);
        extra.from_range = from_range;
    }

    /// Keeps [`Streams::home`] after stream `s`'s count of large segments, or of segments
    /// reserved to grow, changed (called by [`Heap::note`]). Where segments grow in place the
    /// home is the stream holding the range (one stream holds such segments at a time: see
    /// [`Heap::may_grow_in_place`]). Elsewhere a stream that comes to hold more large segments
    /// than the home becomes the home; the home keeps its place while it holds any (segments
    /// reserved for the requests it serves are its own, so it seldom loses them), and when it
    /// holds none the streams are counted again (the most large segments, the lowest id among
    /// equals). In constant time but for that count.
    pub(super) fn track_home(&mut self, s: StreamId) {
        if self.setup.can_unmap {
            if self.streams.slots[s.index()].growable > 0 {
                self.streams.home = Some(s);
            } else if self.streams.home == Some(s) {
                self.streams.home = None;
            }
            return;
        }
        let large = |h: &Heap, x: StreamId| h.streams.slots[x.index()].segments[Pool::Large as usize];
        self.streams.home = match self.streams.home {
            Some(h) if h == s && large(self, s) == 0 => (0..self.streams.slots.len())
                .map(|i| StreamId(i as u32))
                .filter(|&x| large(self, x) > 0)
                .max_by_key(|&x| (large(self, x), std::cmp::Reverse(x.0))),
            Some(h) if large(self, s) > large(self, h) => Some(s),
            None if large(self, s) > 0 => Some(s),
            home => home,
        };
    }

    /// A segment of `pool` joined stream `s` (`joined`) or left it: the stream's counts, which
    /// [`Heap::track_home`] reads next.
    #[inline]
    pub(super) fn count_segment(&mut self, s: StreamId, pool: Pool, growable: bool, joined: bool) {
        let slot = &mut self.streams.slots[s.index()];
        if joined {
            slot.segments[pool as usize] += 1;
            slot.growable += u32::from(growable);
            self.streams.growable += u32::from(growable);
        } else {
            slot.segments[pool as usize] -= 1;
            slot.growable -= u32::from(growable);
            self.streams.growable -= u32::from(growable);
        }
    }

    /// Whether all work queued so far on `stream` is done (`Backend::stream_idle`; an error
    /// counts as busy, and is noted).
    pub(super) fn idle(&mut self, backend: &dyn Backend, stream: StreamId) -> bool {
        self.note(Note::StreamQuery);
        match backend.stream_idle(self.streams.slots[stream.index()].raw) {
            Ok(idle) => {
                let slot = &mut self.streams.slots[stream.index()];
                if idle {
                    slot.idle_at = self.streams.frees;
                }
                slot.last_idle = idle;
                if idle && self.streams.unchecked & stream_bit(stream) != 0 {
                    // The answer covers the loans it gave back unasked, whatever asked: its
                    // work queued before them is done.
                    self.forget_loans_of(stream);
                }
                idle
            }
            Err(e) => {
                self.streams.slots[stream.index()].last_idle = false;
                self.note(Note::BackendError);
                self.accounting.keep_error(format!("querying whether stream {stream} is idle: {e}"));
                false
            }
        }
    }

    /// A large request on `stream` that none of its own free blocks fits, served as a request
    /// of the *home* stream ([`Heap::track_home`]: the one holding the range that grows in
    /// place, or with segments that do not grow the one holding the most large segments),
    /// while that stream is idle: its best fit among the home stream's free blocks, else
    /// whatever the home stream's own request would get ([`Heap::grow`]: its range grown or a
    /// segment reserved for it, over the limit a reclaim first). The block is then lent to
    /// `stream` ([`Heap::lend`]). `None` (the request goes its own way, as before) with
    /// `share_idle_streams:false`, where the request is small, no stream is home, `stream` is,
    /// or the home stream has work queued.
    ///
    /// "Idle" is asked of the backend (`cuStreamQuery`) only where it matters: a free block
    /// of the home stream is lent without asking where no memory joined its free blocks since
    /// it was last seen idle ([`StreamSlot::free_blocks_settled`]; the work that used them was
    /// all queued before then, so none of it still runs, whatever the stream does now), and
    /// growing for `stream` still asks, as it orders `stream` after the home stream's work.
    /// Replayed, where every stream is idle, this changes no decision (47 random traces on two
    /// to four streams and the 54 fixtures, both segment kinds) and halves the queries on
    /// `ensemble_streams` (`BENCHMARKS.md`, "Fewer stream queries").
    ///
    /// Why: with one range per heap, the other streams reserved segments of their own for
    /// their large tensors, and memory that one stream freed served another only as a lent
    /// block over the soft limit. Memory then lay in pieces that did not merge, and replayed
    /// on several streams the heap reserved 1.18–1.20 times its peak of allocated bytes where
    /// the same events on one stream needed 1.01–1.07 and the `cudaMallocAsync` pool on the
    /// streams 1.04–1.16. Served from the range, every stream's large blocks lie in one range
    /// whose holes merge, as on one stream. On 240 traces of random shapes on two to four
    /// streams that no rule had been tried on (seeds 1000–1239 and 7000–7239, replayed as on
    /// CUDA, 4 warm passes), the geometric mean of peak over live fell from 1.179 and 1.200 to
    /// 1.046 and 1.054, lower on all 240 and higher on none; warm driver calls fell from 861
    /// to 75, and no replay called the driver after its second warm pass (15 did)
    /// (`BENCHMARKS.md`, "Several streams in one range"). With segments that do not grow, the
    /// same sets: 1.206 and 1.210 to 1.127 and 1.137, lower on 223 of 240 and higher on 16,
    /// warm calls 1,125 to 574, replays calling after the second warm pass 19 to 19 (8 and 11).
    ///
    /// Why only while the owner is idle: a free block of the owner's may still be used by
    /// the work it queued before freeing it. An idle owner has none; a busy one would have
    /// to make `stream` wait for all its work (`Backend::order_after`), a dependency between
    /// streams that the program never asked for. The `cudaMallocAsync` pool's opportunistic
    /// reuse takes another stream's memory on the same condition (its free complete). Why
    /// only large requests: small ones keep their stream's small segments, whose blocks a
    /// thread's parking slot reuses without the lock (see `park`); lent blocks always go
    /// through it. Lending small blocks too lowered the peaks by under 0.2% on the sets the
    /// rule was chosen on (1.0539 against 1.0558, 1.0474 against 1.0479) and made almost four
    /// times the warm driver calls (175 against 46).
    pub(super) fn serve_from_range(
        &mut self,
        backend: &dyn Backend,
        stream: StreamId,
        requested: u64,
        size: u64,
    ) -> Result<Option<Grown>> {
        // A large size is in the large pool whatever the stream holds (`Heap::pool_for`).
        if !self.setup.config.share_idle_streams || Self::pool_of(size) != Pool::Large {
            return Ok(None);
        }
        let Some(owner) = self.streams.home else { return Ok(None) };
        // The owner's free blocks need no query where none joined them since the owner was
        // last seen idle (`StreamSlot::free_blocks_settled`): on CUDA each query is a
        // `cuStreamQuery`, about half a microsecond, and a request of a stream beside the range
        // asked one every time (`BENCHMARKS.md`, "Fewer stream queries").
        let settled = self.streams.slots[owner.index()].free_blocks_settled();
        if owner == stream || !(settled || self.idle(backend, owner)) {
            return Ok(None);
        }
        self.streams.mark_allocating(owner);
        self.settle();
        let mut busy = false;
        let found = self.find_checked(backend, Pool::Large, (owner, stream), size, &mut busy);
        // A borrower found busy just now ordered the owner after it: lent only while the owner
        // is idle then (so that the borrower's work is done), as above.
        if busy && !self.idle(backend, owner) {
            return Ok(None);
        }
        if let Some(b) = found {
            return Ok(Some(Grown::Free(b)));
        }
        // Growing orders `stream` after the owner's work (below): only while the owner has
        // none queued, as before.
        if settled && !self.idle(backend, owner) {
            return Ok(None);
        }
        // Without a block kept aside (`deferred` is `None`), what `grow` finds is still a free
        // block, not yet taken: if `stream` cannot be ordered below, it stays where it is.
        // Served for another stream: no view (a view's block is never lent; `alias.rs`).
        let found = self.grow(backend, Pool::Large, owner, requested, size, None)?;
        debug_assert!(matches!(found, Grown::Free(_) | Grown::Lent(_)));
        // The owner's request may take memory of a third stream, ordering the owner after it
        // (a segment taken over, a block lent): ordered after the owner, `stream` waits for
        // that stream too. The idle owner itself holds `stream` up for nothing. Where the
        // backend cannot order them, the request goes its own way: that memory may still be
        // in use by work `stream` would not wait for.
        if !self.order_streams(backend, stream, owner, "to use memory its range took") {
            return Ok(None);
        }
        Ok(Some(found))
    }

    /// At the free of block `i` (used on `uses` besides its segment's stream), lent to the
    /// stream in `lent_to` (with whether [`Heap::serve_from_range`] lent it): where the borrower
    /// has no work queued, the block goes back to its owner at once with nothing to order.
    /// Else, for a block lent from the range, the free waits for an event on the borrower (so
    /// that the range's stream never waits for another's work); for a block lent over the
    /// limit, orders the owner's stream after the borrower's work queued so far
    /// (`Backend::order_after`: on CUDA the owner waits for an event, the host does not block),
    /// so that the block goes back to its owner at once instead of waiting for an event on the
    /// borrower to complete (until the device has passed it the block is out of everyone's
    /// reach, and the owner may reserve memory anew meanwhile). Leaves in `uses` the streams
    /// still to wait for, and returns whether the block went back to its owner, and whether it
    /// went back with no stream's work left on it (the borrower idle and the owner's stream
    /// never using it: it then joins the owner's free blocks without making them unsettled,
    /// `StreamSlot::free_blocks_settled`); if the backend could not order the streams, the
    /// free waits for the borrower's event as after `record_stream`. `lent_to`: the borrower,
    /// whether the range lent it, and whether the owner's stream used it too.
    ///
    /// Whether the borrower is idle is asked later where it was idle when last asked
    /// ([`StreamSlot::last_idle`]): the block goes back at once, counted as unchecked, and
    /// [`Heap::check_returns`] asks before anything else can reach it (a request of another
    /// stream, a reserve, release or unmap, `empty_cache`). The borrower's own requests need
    /// no answer: its work on the block was queued before the free, so its later work runs
    /// after. One question then covers every loan the stream gave back since: on
    /// `ensemble_streams` replayed as on CUDA, 135 questions a pass instead of 2,308, with the
    /// same decisions (`BENCHMARKS.md`, "Loans given back unasked"). Where the answer is
    /// "busy", the owners are ordered after the borrower then, as for a loan over the limit.
    pub(super) fn hand_back(
        &mut self,
        backend: &dyn Backend,
        i: BlockId,
        uses: &mut Vec<StreamId>,
        lent_to: Option<(StreamId, bool, bool)>,
    ) -> (bool, bool) {
        let Some((borrower, from_range, used_by_owner)) = lent_to else { return (false, false) };
        let owner = self.blocks[i].stream;
        let (by, to) = (stream_bit(borrower), stream_bit(owner));
        if by != 0 && to != 0 && self.streams.slots[borrower.index()].last_idle {
            if self.streams.unchecked_loans.len() >= MAX_UNCHECKED {
                // Asked now and then all the same, so that the list stays short (the
                // borrower's own loans need no answer: it stays idle when last asked).
                self.check_returns(backend, !by);
            }
            let b = &self.blocks[i];
            self.streams.unchecked_loans.push(UncheckedLoan {
                borrower,
                owner,
                segment: b.segment,
                addr: b.addr,
                size: b.size,
            });
            self.streams.unchecked |= by;
            self.streams.slots[owner.index()].owed_by |= by;
            uses.retain(|&s| s != borrower);
            return (true, !used_by_owner);
        }
        if self.idle(backend, borrower) {
            // Nothing the borrower queued can still touch the block, nor could the owner's
            // work while it was lent, unless the owner's stream used it (`record_stream`).
            uses.retain(|&s| s != borrower);
            return (true, !used_by_owner);
        }
        if from_range {
            // As after `record_stream`: reused once an event on the borrower completes, so
            // that the owner's work never waits for the borrower's.
            return (false, false);
        }
        if !self.order_streams(backend, owner, borrower, "to take back a block it lent") {
            return (false, false);
        }
        uses.retain(|&s| s != borrower);
        (true, false)
    }

    /// Asks whether the streams that gave loans back unasked ([`Heap::hand_back`]), but those
    /// in `except` (by bit), are idle now. Called before anything but the borrower's own
    /// requests could reach those blocks: where a request of another stream would take memory
    /// a loan lies in ([`Heap::find_checked`]: only the borrowers of those loans) or a view
    /// could ([`Heap::check_others`]), before the heap grows, lends over the limit or takes a
    /// segment over ([`Heap::grow`]), before any reclaim (`Heap::reclaim`, which `take` may
    /// call too, to map pages), and at `empty_cache` ([`Heap::release_cache`]). A stream found
    /// busy has work queued since it was last seen idle that may still use the blocks it gave
    /// back: their owners' streams are ordered after it (`Backend::order_after`), so that their
    /// work, and that of any stream ordered after them to take their memory, waits for it
    /// without the host blocking, and their free blocks count as unsettled. Where the backend
    /// cannot order them, the host waits for the borrower (`Backend::synchronize`); where
    /// that fails too, the error is noted and the free blocks over its loans are kept out of
    /// use ([`Heap::strand_loans`]). Returns whether every stream asked about was idle.
    pub(super) fn check_returns(&mut self, backend: &dyn Backend, except: u64) -> bool {
        let mut all_idle = true;
        for borrower in streams_in(self.streams.unchecked & !except) {
            self.streams.unchecked &= !stream_bit(borrower);
            let owners = self.loan_owners(borrower);
            let mut ordered = self.idle(backend, borrower);
            if !ordered {
                all_idle = false;
                ordered = true;
                for owner in streams_in(owners) {
                    ordered = self.order_streams(backend, owner, borrower, "to take back blocks it lent");
                    self.streams.note_freed(owner);
                    if !ordered {
                        break;
                    }
                }
            }
            if !ordered {
                if let Err(e) = backend.synchronize(self.streams.slots[borrower.index()].raw) {
                    self.note(Note::BackendError);
                    self.accounting.keep_error(format!(
                        "stream {borrower} gave back blocks it had borrowed and could be neither waited \
                         for nor synchronized ({e}): the free memory around them is kept out of use"
                    ));
                    self.strand_loans(borrower);
                }
            }
            self.forget_loans_of(borrower);
        }
        all_idle
    }

    /// The streams (by bit) whose free blocks took back loans `borrower` gave back unasked.
    fn loan_owners(&self, borrower: StreamId) -> u64 {
        (self.streams.unchecked_loans.iter()).filter(|l| l.borrower == borrower).fold(0, |m, l| m | stream_bit(l.owner))
    }

    /// Drops `borrower`'s loans given back unasked from the list and the marks, once asked
    /// about (or kept out of use).
    fn forget_loans_of(&mut self, borrower: StreamId) {
        let bit = stream_bit(borrower);
        let owners = self.loan_owners(borrower);
        self.streams.unchecked_loans.retain(|l| l.borrower != borrower);
        for owner in streams_in(owners) {
            self.streams.slots[owner.index()].owed_by &= !bit;
        }
        self.streams.unchecked &= !bit;
    }

    /// The borrowers (by bit, `requester` aside) whose loans given back unasked
    /// ([`Heap::hand_back`]) overlap the first `size` bytes of free block `b`: what a request
    /// of `requester` would take of it ([`Heap::take`] hands out a block's front). Only those
    /// borrowers need asking before it does: the rest of the block stays free, and their other
    /// loans lie elsewhere.
    pub(super) fn owed_in(&self, b: BlockId, size: u64, requester: StreamId) -> u64 {
        let blk = &self.blocks[b];
        let (segment, lo, hi) = (blk.segment, blk.addr, blk.addr + size.min(blk.size));
        // Only the borrowers marked on the block's stream can have loans in it; the latest
        // loans first (a request often takes what was given back last), until all are found.
        let marked = self.streams.slots[blk.stream.index()].owed_by & !stream_bit(requester);
        if marked == 0 {
            return 0;
        }
        let mut owed = 0;
        for l in self.streams.unchecked_loans.iter().rev() {
            if l.segment == segment && l.addr < hi && lo < l.addr + l.size {
                owed |= stream_bit(l.borrower) & marked;
                if owed == marked {
                    break;
                }
            }
        }
        owed
    }

    /// Best fit among `owner`'s free blocks of `pool` for a request of `size` bytes on
    /// `requester` ([`Heap::find_free`]), once the borrowers whose loans given back unasked lie
    /// in what the request would take of it are asked about ([`Heap::check_returns`]): a
    /// request asks only where it would take such memory. Asking at every request of another
    /// stream about every such loan, wherever it lay, made the same decisions with more
    /// queries (`fsdp_layer_gather` replayed as on CUDA: 945 a warm pass against 672;
    /// `docs/lab/`).
    ///
    /// An answer may change the free blocks (where a borrower can be neither waited for nor
    /// synchronized, its loans are kept out of use, [`Heap::strand_loans`]): the best fit is
    /// then found again, until one needs no question (each round asks about other borrowers,
    /// so at most one round per stream). `busy` is set where a borrower asked about was busy
    /// (`owner`'s stream is then ordered after it, and its free blocks are unsettled).
    #[inline]
    pub(super) fn find_checked(
        &mut self,
        backend: &dyn Backend,
        pool: Pool,
        (owner, requester): (StreamId, StreamId),
        size: u64,
        busy: &mut bool,
    ) -> Option<BlockId> {
        let b = self.find_free(pool, owner, size, true)?;
        if self.streams.slots[owner.index()].owed_by & !stream_bit(requester) == 0 {
            // No loan given back unasked lies in `owner`'s free blocks: the common case.
            return Some(b);
        }
        self.find_asking(backend, pool, (owner, requester), size, b, busy)
    }

    /// [`Heap::find_checked`] where loans given back unasked lie in the owner's free blocks:
    /// asks about those in `b` (its best fit), then finds again, until a fit needs no question.
    #[inline(never)]
    fn find_asking(
        &mut self,
        backend: &dyn Backend,
        pool: Pool,
        (owner, requester): (StreamId, StreamId),
        size: u64,
        mut b: BlockId,
        busy: &mut bool,
    ) -> Option<BlockId> {
        loop {
            let owed = self.owed_in(b, size, requester);
            if owed == 0 {
                return Some(b);
            }
            *busy |= !self.check_returns(backend, !owed);
            b = self.find_free(pool, owner, size, true)?;
        }
    }

    /// Asks about the loans given back unasked by every stream but `requester`
    /// ([`Heap::check_returns`]), before a request of `requester` reaches free blocks by a way
    /// other than [`Heap::find_checked`] (a view of its range's free mappings).
    pub(super) fn check_others(&mut self, backend: &dyn Backend, requester: StreamId) {
        let own = stream_bit(requester);
        if self.streams.unchecked & !own != 0 {
            self.check_returns(backend, own);
        }
    }

    /// Keeps the free blocks over the loans `borrower` gave back unasked out of use for good
    /// (state `Stranded`, given back with their segments when the allocator ends), where its
    /// work may still use them and the backend could neither order nor synchronize it. A block
    /// that merged with its free neighbours takes them along; what the borrower's own later
    /// requests took is its own to order. So does a block over them still waiting for other
    /// streams' events (a loan recorded on other streams too, `record_stream`): its wait would
    /// otherwise end among its owner's free blocks, unordered after the borrower (found by the
    /// shadow model in CI; its case is kept in `tests/shadow_model.proptest-regressions`).
    fn strand_loans(&mut self, borrower: StreamId) {
        self.settle();
        let loans: Vec<_> = self.streams.unchecked_loans.iter().filter(|l| l.borrower == borrower).copied().collect();
        for UncheckedLoan { segment: seg, addr, size, .. } in loans {
            let mut next = self.segments[seg].head.filter(|_| self.segments[seg].live);
            while let Some(b) = next {
                let blk = &self.blocks[b];
                next = blk.next;
                if blk.addr >= addr + size {
                    break;
                }
                if blk.addr + blk.size <= addr {
                    continue;
                }
                match blk.state {
                    BlockState::Free => {
                        let (size, pool) = (blk.size, blk.pool);
                        self.unindex_free(b);
                        self.blocks[b].state = BlockState::Stranded;
                        self.note(Note::Strand { size, pool });
                    }
                    // Counted as in use already; its events still complete (`event_done`
                    // leaves a stranded block out of use).
                    BlockState::PendingFree => self.blocks[b].state = BlockState::Stranded,
                    _ => {}
                }
            }
        }
    }

    /// Orders stream `waiting`'s work after the work queued so far on stream `on` (on CUDA
    /// without blocking the host: `Backend::order_after`), before memory `on` used passes to
    /// `waiting`; false, the error noted with `why` (what the ordering was for), if the backend
    /// could not.
    pub(super) fn order_streams(&mut self, backend: &dyn Backend, waiting: StreamId, on: StreamId, why: &str) -> bool {
        match backend.order_after(self.streams.slots[waiting.index()].raw, self.streams.slots[on.index()].raw) {
            Ok(()) => true,
            Err(e) => {
                self.note(Note::BackendError);
                self.accounting.keep_error(format!("ordering stream {waiting} after stream {on} {why}: {e}"));
                false
            }
        }
    }

    /// Whether free block `b` is a whole cached segment of a stream that is idle: one that has
    /// not allocated during the last [`IDLE_GROWS`] requests that found no
    /// cached block.
    fn idle_whole(&self, b: BlockId) -> bool {
        self.whole_free(b)
            && self.streams.slots[self.blocks[b].stream.index()].last_alloc + IDLE_GROWS <= self.streams.grows
    }

    /// The sweep, every `IDLE_GROWS` requests that found no cached block: releases the idle
    /// streams' whole segments that the last sweep offered for adoption and nobody took, and
    /// offers those of the streams idle now. A program creating streams without end thus holds
    /// the cache of at most about `2 * IDLE_GROWS` idle streams, and a sweep costs less than
    /// one step per request on average.
    pub(super) fn release_idle(&mut self, backend: &dyn Backend) {
        for b in std::mem::take(&mut self.streams.adoptable) {
            if self.idle_whole(b) {
                self.release_segment_of(backend, b);
            }
        }
        let idle: Vec<BlockId> = self.free.whole().iter().copied().filter(|&b| self.idle_whole(b)).collect();
        self.streams.adoptable = idle;
    }

    /// Instead of reserving a new segment for `size` bytes on `stream`, takes over a whole
    /// cached segment of at least that size that the last sweep offered: one of a stream idle
    /// for [`IDLE_GROWS`] requests that found no cached block (a stream the
    /// program is done with, as when it makes a stream per request). Looks at the last
    /// [`LOOK`] offered only, so that a request costs constant time.
    pub(super) fn adopt(&mut self, backend: &dyn Backend, pool: Pool, stream: StreamId, size: u64) -> Option<BlockId> {
        let len = self.streams.adoptable.len();
        let mut k = len;
        while k > len.saturating_sub(LOOK) {
            k -= 1;
            let b = self.streams.adoptable[k];
            if !self.idle_whole(b) {
                self.streams.adoptable.swap_remove(k);
                continue;
            }
            let blk = &self.blocks[b];
            if blk.pool != pool || blk.size < size || blk.stream == stream {
                continue;
            }
            if !self.take_over(backend, b, stream) {
                return None;
            }
            self.streams.adoptable.swap_remove(k);
            return Some(b);
        }
        None
    }

    /// Adds a stream, returning its allocator-local id.
    pub(crate) fn add_stream(&mut self, raw: RawStream) -> Result<StreamId> {
        let id = u32::try_from(self.streams.slots.len())
            .map_err(|_| Error::from(crate::error::UsageError::TooManyStreams))?;
        self.streams.slots.push(StreamSlot::new(raw));
        Ok(StreamId(id))
    }

    /// The backend's handles of the streams, by allocator-local id.
    pub(crate) fn raw_streams(&self) -> impl Iterator<Item = RawStream> + '_ {
        self.streams.slots.iter().map(|s| s.raw)
    }
}
