//! The allocator's state behind its lock: blocks, segments, free indexes, pending frees and
//! statistics, and the algorithms over them. Nothing here locks or knows about threads.
//!
//! The heap is its blocks and segments, the free index over them and the block freed last,
//! with five parts that each own a concern: their fields are private to their file, so the
//! rules that may change a part's state are the methods in that file.
//!
//! Where each rule lives:
//!
//! - here: serving a request (`alloc`: the block freed last, then best fit, then an idle
//!   stream's segment, a block lent by another stream or a new segment, the block freed last
//!   handed on as it lies where its segment changes stream) and freeing (`free`, merging with
//!   free neighbours); what the heap was made with (`Setup`, a plain record);
//! - [`sizing`]: rounding, pools and segment sizes (PyTorch's rules), oversize blocks;
//! - [`block`]: what the arena holds: blocks, their rarer parts, segments;
//! - [`arena`]: new and dropped blocks and segments, spare [`Extra`]s, the free index's keys;
//! - [`pages`]: reclaiming and releasing cached memory under the limit, taking a segment over
//!   from another stream, mapping and unmapping pages;
//! - [`expand`]: growing a segment in place at its end (PyTorch's expandable segments);
//! - [`recorded`]: memory the program allocated elsewhere, recorded as segments of one block
//!   (`CachingAllocator::external`, the CUDA observer);
//! - [`check`]: the invariants, recounted from the blocks (tests and `check_invariants`).
//!
//! The parts:
//!
//! - [`limit::Limit`] (`limit.rs`): the fragmentation limit and the cap, with what their rules
//!   remember; told of new figures, asked for the limit in force;
//! - [`streams::Streams`] (`streams.rs`): the streams, the frees waiting for their events
//!   (`record_stream`), the clock that tells idle streams, the home stream, the idle streams'
//!   segments offered for adoption, and the loans between streams;
//! - [`alias::Views`] (`alias.rs`): views, a range's free pages mapped again at addresses of
//!   their own;
//! - [`recorded_map::RecordedMap`] (`recorded_map.rs`): the program's own memory by address,
//!   and its streams;
//! - [`accounting::Accounting`] (`accounting.rs`): the statistics and the history. The heap's
//!   algorithms say what happened (`Note`) and only that file writes counters and history
//!   events: [`Heap::note`], the public resets, the recorder's settings.

use super::config::AllocatorConfig;
use super::free_index::{Flags, FreeIndex};
use super::ids::{BlockId, SegmentId, Slots, StreamId};
use super::park::{BlockClass, Trips};
use pages::Deferred;

mod accounting;
mod alias;
mod arena;
mod block;
pub use block::TensorMeta;
pub(crate) use block::{Block, BlockState, Extra, Segment};
mod check;
mod expand;
mod limit;
mod pages;
mod recorded;
mod recorded_map;
pub(crate) use recorded::Made;
mod sizing;
mod streams;
use super::stats::{Pool, Stats};
use crate::backend::{Backend, RawEvent, RawStream};
use crate::error::{BackendError, Error, InvalidRequest, OomReport, Result, Rounding};
use crate::record::{Context, Pending, RecordConfig, Recorder};
use accounting::{Accounting, Note};
use alias::Views;
pub(crate) use check::check_heap;
use limit::Limit;
use recorded_map::RecordedMap;
use streams::Streams;

/// Smallest block, and the granularity of rounding.
pub(crate) const MIN_BLOCK: u64 = 512;
/// Requests of at most this go to the small pool.
pub(crate) const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool.
pub(crate) const SMALL_SEGMENT: u64 = 2 << 20;
/// How many emptied [`Extra`]s the heap keeps for reuse (`Heap::spare_extras`): 88 bytes each
/// on x86-64, with what their `uses` hold.
const SPARE_EXTRAS: usize = 256;
/// Segment size for large requests below [`MIN_LARGE_ALLOC`].
pub(crate) const LARGE_SEGMENT: u64 = 20 << 20;
/// Large requests of at least this get a segment of their own size.
pub(crate) const MIN_LARGE_ALLOC: u64 = 10 << 20;

/// What merging the block kept aside by the last free would make (see [`Heap::hot_merge`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HotMerge {
    /// The kept block.
    pub(crate) hot: BlockId,
    /// Its free neighbours, which the merge absorbs.
    pub(crate) prev: Option<BlockId>,
    pub(crate) next: Option<BlockId>,
    /// The free block it makes.
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// Whether that block shares its segment with other blocks.
    pub(crate) split: bool,
}

/// A stream that has not allocated while the allocator reserved this many segments is idle:
/// its fully free cached segments are released before the next segment is reserved.
pub(crate) const IDLE_GROWS: u64 = 64;

/// Where a segment's place in reservation order starts in [`Heap::order_key`]: room for
/// offsets up to 16 TiB (a segment's addresses, room included, span at most the device's
/// memory); after 2^20 segments the count starts again. Either wrapping only reorders ties,
/// still in an order that no address decides.
const ORDER_SHIFT: u32 = 44;

/// What a heap was made with: settings read by every part, changed by none (but
/// `defer_hot`, by tests).
#[derive(Debug)]
struct Setup {
    device: usize,
    config: AllocatorConfig,
    /// The backend's page size (at least [`MIN_BLOCK`]): the unit of mapping.
    page: u64,
    /// Whether pages may be unmapped and mapped again (the backend can, and
    /// `release_pages` is on).
    can_unmap: bool,
    /// Whether [`Heap::grow`] may defer merging the block freed last (off only to test that
    /// deferring changes nothing).
    defer_hot: bool,
}

impl Setup {
    /// Whether a block or segment of `size` bytes is oversize: at least PyTorch's
    /// `max_split_size`, when one is set.
    #[inline]
    fn is_oversize(&self, size: u64) -> bool {
        self.config.max_split_size.is_some_and(|m| size >= m)
    }
}

/// The whole mutable state of one allocator.
#[derive(Debug)]
pub(crate) struct Heap {
    setup: Setup,
    blocks: Slots<BlockId, Block>,
    /// Emptied [`Extra`]s kept for the next block that needs one (at most [`SPARE_EXTRAS`]),
    /// with the capacity of their `uses`: a block lent or used on another stream gets one at
    /// every allocation and gives it back at its free, two heap allocations and two frees a
    /// pair otherwise (see [`Heap::extra_mut`]). Boxed as in [`Block::extra`], so that they
    /// move between the two without a copy or an allocation.
    #[allow(clippy::vec_box)]
    spare_extras: Vec<Box<Extra>>,
    segments: Slots<SegmentId, Segment>,
    free: FreeIndex,
    /// The next segment's place in reservation order ([`Segment::order`]).
    next_order: u64,
    /// The fragmentation limit and the cap, with what their rules remember.
    limit: Limit,
    /// The statistics, the history and what deciding them needs.
    accounting: Accounting,
    /// Views of ranges' free pages (`alias.rs`).
    views: Views,
    /// The streams, the frees waiting for their events, the loans between them and what tells
    /// idle ones.
    streams: Streams,
    /// The block freed last, if it is kept aside unmerged for the next request of its exact
    /// size on its stream (or on another stream that takes its segment over); see
    /// [`Heap::settle`] and [`Heap::deferred_hot`].
    hot: Option<BlockId>,
    /// Memory the program allocated itself, recorded by address, and its streams (see
    /// `recorded.rs`).
    recorded: RecordedMap,
}

/// What [`Heap::grow`] found for a request.
#[derive(Debug, Clone, Copy)]
enum Grown {
    /// A free block (new, or of a segment taken over) for `take` to hand out.
    Free(BlockId),
    /// The block to hand out as it is, already its size and off the free index.
    Handed(BlockId),
    /// A free block of another stream's segment, lent to the request's stream (see
    /// [`Heap::lend`]).
    Lent(BlockId),
}

/// What `alloc` hands back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) block: BlockId,
    pub(crate) addr: u64,
    pub(crate) class: BlockClass,
    /// The block lies in another stream's segment: its free must go through the heap (which
    /// orders the owner after the request's stream, see `Heap::hand_back`), never a parking
    /// slot. So must a view's block (`alias.rs`), whose free gives its runs back.
    pub(crate) lent: bool,
}

impl Heap {
    pub(crate) fn new(device: usize, config: AllocatorConfig, record: RecordConfig, backend: &dyn Backend) -> Self {
        let page = backend.page_size().max(MIN_BLOCK);
        debug_assert!(page.is_power_of_two());
        let stats = Stats { max_split_size: config.max_split_size.unwrap_or(u64::MAX), ..Stats::default() };
        Heap {
            views: Views::new(backend.can_unmap() && config.release_pages && config.alias_pages && backend.can_alias()),
            blocks: Slots::new(),
            spare_extras: Vec::new(),
            segments: Slots::new(),
            free: FreeIndex::new(),
            next_order: 0,
            limit: Limit::new(&config, backend, page),
            hot: None,
            setup: Setup {
                device,
                page,
                can_unmap: backend.can_unmap() && config.release_pages,
                defer_hot: true,
                config,
            },
            accounting: Accounting::new(stats, record),
            streams: Streams::new(),
            recorded: RecordedMap::default(),
        }
    }

    // ----- allocation -------------------------------------------------------------------

    /// Allocates a block of at least `requested` bytes on allocator stream `stream`.
    pub(crate) fn alloc(
        &mut self,
        backend: &dyn Backend,
        stream: StreamId,
        requested: u64,
        ctx: Option<Context>,
    ) -> Result<Grant> {
        self.accounting.serving(ctx);
        let grant = self.serve(backend, stream, requested, ctx);
        self.accounting.serving(None);
        grant
    }

    /// [`Heap::alloc`]'s work, with `request_ctx` set.
    fn serve(
        &mut self,
        backend: &dyn Backend,
        stream: StreamId,
        requested: u64,
        ctx: Option<Context>,
    ) -> Result<Grant> {
        let size = self
            .round_size(requested)
            .ok_or_else(|| Error::from(InvalidRequest::RoundingOverflow { requested, to: Rounding::Block }))?;
        if self.streams.has_pending() {
            self.process_pending(backend);
        }
        let pool = self.pool_for(size, stream);
        self.streams.mark_allocating(stream);
        let block = match self.hot {
            Some(hot) if self.blocks[hot].size == size && self.blocks[hot].stream == stream => {
                // The block freed last has this very size: reuse it as it is (no index lookup,
                // split or merge). Best fit could have picked another block of the same size.
                self.hot = None;
                if self.accounting.peaks_behind() {
                    self.accounting.lift_split_peaks();
                }
                hot
            }
            _ => {
                // The block freed last may be about to become a whole segment that this request
                // takes over from its stream; see `Heap::deferred_hot`.
                let deferred = self.deferred_hot(pool, stream, size);
                if deferred.is_none() || !self.setup.defer_hot {
                    self.settle();
                }
                // Whether the block comes from another stream's range (`Heap::serve_from_range`).
                let mut ranged = false;
                // Loans other streams gave back unasked are asked about before this request
                // takes their memory (`Heap::find_checked`); the stream's own need no answer.
                // Not for the block freed last: it is the stream's own, freed with no other
                // stream's use and never merged, so a loan cannot lie in it; and a block a
                // thread parked is taken back without the lock just where this shortcut
                // would hand it out, so asking here would make parking visible.
                let found = match self.find_checked(backend, pool, (stream, stream), size, &mut false) {
                    Some(i) => {
                        // Merging the block freed last changes only its own stream's blocks.
                        self.settle();
                        Grown::Free(i)
                    }
                    None => match self.serve_from_range(backend, stream, requested, size)? {
                        Some(found) => {
                            ranged = true;
                            found
                        }
                        None => match self.try_view(backend, pool, stream, size) {
                            Some(b) => Grown::Handed(b),
                            None => self.grow(backend, pool, stream, requested, size, deferred)?,
                        },
                    },
                };
                let lent = ranged || matches!(found, Grown::Lent(_));
                let b = match found {
                    // A failure here is mapping pages for a cached block, even after a retry.
                    Grown::Free(i) | Grown::Lent(i) => {
                        self.take(backend, i, size).map_err(|e| self.oom(backend, requested, size, e))?
                    }
                    Grown::Handed(i) => i,
                };
                if lent && self.blocks[b].stream != stream {
                    self.lend(b, stream, ranged);
                }
                b
            }
        };
        let b = &mut self.blocks[block];
        b.state = BlockState::Allocated;
        b.requested = requested;
        b.ctx = ctx;
        // The shortcut for the block freed last reuses it only for a request rounded to its
        // very size, and so may a thread's parking slot (see `park`).
        let reusable = b.size == size;
        // The block's own pool: the block freed last may lie in the other one (a segment that
        // served every size while one stream held them all).
        let (addr, size, pool, b_stream, view) = (b.addr, b.size, b.pool, b.stream, b.view);
        self.note(Note::Alloc { addr, size, requested, pool, stream, ctx });
        self.limit.note_allocated(self.accounting.stats().allocated_bytes.current());
        let class = BlockClass { size, pool, oversize: self.is_oversize(size), reusable };
        Ok(Grant { block, addr, class, lent: b_stream != stream || view })
    }

    /// Best fit among the free blocks of `pool` on `stream`, the free end of a segment that
    /// grows in place last ([`Heap::is_wilderness`]); with `keep_oversize`, none that PyTorch's
    /// `max_split_size` rules keep from this request ([`Heap::keeps_oversize`]).
    pub(super) fn find_free(&self, pool: Pool, stream: StreamId, size: u64, keep_oversize: bool) -> Option<BlockId> {
        let (mut block, mut found) = self.free.find(pool as usize, stream.0, size)?;
        if self.is_wilderness(block, stream) {
            if let Some(hole) = self.free.find_except(pool as usize, stream.0, size, block) {
                (block, found) = hole;
            }
        }
        if keep_oversize && self.keeps_oversize(block, found, size) {
            return None;
        }
        Some(block)
    }

    /// Hands out the first `size` bytes of free block `i`, mapping whatever of them is
    /// unmapped. Without a split, `i` itself leaves the index. With one, a new block takes the
    /// front and `i` keeps the rest, so that its index entry is only resized, usually in place.
    ///
    /// The split comes before the mapping: while the front is mapped, the remainder is a free
    /// block like any other, whose mapped pages a reclaim may give back. Mapped first, a
    /// request for the front of a large free block whose pages lie unmapped at its start and
    /// mapped further on grew reserved past the soft limit, the remainder out of reach.
    fn take(&mut self, backend: &dyn Backend, i: BlockId, size: u64) -> Result<BlockId, BackendError> {
        let b = &self.blocks[i];
        let seg = b.segment;
        let remaining = b.size - size;
        // The flag says the block may hold unmapped granules; none can where the whole
        // segment is mapped (no page scan then).
        let unmapped = b.unmapped && !self.segments[seg].wholly_mapped();
        if !self.splits(seg, remaining, b.size) {
            // Everything handed out is mapped: the whole block (an oversize block may hold
            // unmapped granules past the request).
            let (addr, len) = (b.addr, b.size);
            self.unindex_free(i);
            if unmapped {
                if let Err(e) = self.ensure_mapped(backend, i, addr, len) {
                    // Back among the free blocks, merged: a refusal releases the cache first,
                    // which completes pending frees, and a neighbour may be free now.
                    self.merge_free(i);
                    return Err(e);
                }
            }
            self.blocks[i].unmapped = false;
            return Ok(i);
        }
        let front = Block {
            addr: b.addr,
            size,
            requested: 0,
            segment: seg,
            pool: b.pool,
            prev: b.prev,
            next: Some(i),
            stream: b.stream,
            state: BlockState::Allocated,
            unmapped: false,
            view: false,
            pending_events: 0,
            extra: None,
            ctx: None,
        };
        self.uncount_split(i);
        let a = self.new_block(front);
        match self.blocks[a].prev {
            None => self.segments[seg].head = Some(a),
            Some(prev) => self.blocks[prev].next = Some(a),
        }
        let b = &mut self.blocks[i];
        b.prev = Some(a);
        b.addr += size;
        b.size = remaining;
        let rest = b.size;
        let flags = self.free_flags(i);
        let key = self.order_key(i);
        self.free.update(i, rest, key, flags);
        self.count_split(i);
        if unmapped {
            let addr = self.blocks[a].addr;
            if let Err(e) = self.ensure_mapped(backend, a, addr, size) {
                // Back into the free block it came from, as before the split.
                self.blocks[a].unmapped = true;
                self.merge_free(a);
                return Err(e);
            }
        }
        Ok(a)
    }

    /// No cached block fits: reclaim if over the soft limit, then reserve a new segment,
    /// retrying once after releasing the whole cache if the backend refuses.
    ///
    /// With `deferred`, the block freed last is still kept aside although it would merge into a
    /// whole segment: this behaves exactly as if it had been merged before (it is, before any
    /// step that could see the difference), except that taking that segment over hands out the
    /// kept block as it lies instead of merging and splitting it again.
    fn grow(
        &mut self,
        backend: &dyn Backend,
        pool: Pool,
        stream: StreamId,
        requested: u64,
        size: u64,
        mut deferred: Option<Deferred>,
    ) -> Result<Grown> {
        let mut seg_size = self
            .segment_size(size)
            .ok_or_else(|| Error::from(InvalidRequest::RoundingOverflow { requested, to: Rounding::Segment }))?;
        let exact = size.next_multiple_of(self.setup.page);
        // What follows may release, unmap, lend or move any free block, the request's stream's
        // own unchecked loans included: every stream is checked first.
        if self.streams.any_unchecked() {
            self.check_returns(backend, 0);
        }
        self.note_regrowth(size, seg_size);
        if self.streams.grew() {
            // The block freed last merges here; a hand-off takes the merged segment over.
            self.settle();
            self.release_idle(backend);
        }
        if let Some(b) = self.adopt(backend, pool, stream, size) {
            self.settle();
            return Ok(Grown::Free(b));
        }
        // On a single-stream heap that can map pages, grow a segment in place instead: the
        // request then costs only what its segment's free end lacks (see `expand.rs`).
        let mut growth = None;
        if self.may_grow_in_place(pool, stream) {
            self.settle();
            deferred = None;
            growth = self.growth_plan(stream, size);
        }
        let need = growth.map_or(seg_size, |g| g.by);
        let limit = self.soft_limit(backend, size);
        if self.reserved() + need > limit {
            // Over the limit, where another stream's cache fits the request, use it rather than
            // release cached segments to reserve a new one: the segment of a temporary that
            // another stream freed just now is handed on (see `Heap::deferred_hot`), else the
            // best fit among the other streams' free blocks is lent (`Heap::lendable`; unless
            // waiting failed just now).
            let fits = seg_size.max(exact);
            let errors = self.accounting.stats().num_backend_errors;
            let taken = match deferred.filter(|d| d.segment_size <= fits) {
                Some(d) if self.hot == Some(d.hot) => self.take_over_deferred(backend, d, stream).map(Grown::Handed),
                Some(d) => self.take_over_merged(backend, d, stream).map(Grown::Free),
                None => None,
            };
            let taken = match taken {
                // PyTorch's `max_split_size` rules give way rather than the limit: the best fit
                // on the request's stream, whatever its size (see `Heap::keeps_oversize`).
                None if self.setup.config.max_split_size.is_some() => {
                    self.settle();
                    self.find_free(pool, stream, size, false).map(Grown::Free)
                }
                taken => taken,
            };
            let taken = match taken {
                None if self.accounting.stats().num_backend_errors == errors => {
                    self.borrow(backend, pool, stream, size)
                }
                taken => taken,
            };
            if let Some(taken) = taken {
                return Ok(taken);
            }
            let alone = self.holds_every_segment_of_both(stream);
            self.reclaim(backend, need, limit, growth.is_some(), alone);
            if self.reserved() + seg_size > limit {
                // Over-allocating for amortization must not set a new peak.
                seg_size = exact;
            }
            if growth.is_some() {
                // Reclaiming may have released or unmapped the segment planned for.
                growth = self.growth_plan(stream, size);
            }
        }
        self.settle();
        // A growth refused is handled as a refused segment: release the cache, then one
        // segment of the request's size.
        let first = match growth {
            Some(g) => match self.grow_in_place(backend, g) {
                Ok(b) => return Ok(Grown::Free(b)),
                Err(e) => Err(e),
            },
            None => self.reserve_segment(backend, pool, stream, seg_size),
        };
        let (addr, room) = match first {
            Ok(r) => r,
            Err(first) => {
                self.note(Note::Retry);
                self.release_cache(backend, true);
                match self.reserve_segment(backend, pool, stream, exact) {
                    Ok(r) => {
                        seg_size = exact;
                        r
                    }
                    Err(_) => return Err(self.oom(backend, requested, size, first)),
                }
            }
        };
        Ok(Grown::Free(self.add_segment(pool, stream, addr, seg_size, room)))
    }

    fn add_segment(&mut self, pool: Pool, stream: StreamId, addr: u64, size: u64, room: u64) -> BlockId {
        let growable = room > 0;
        let granule =
            if self.setup.can_unmap { crate::backend::map_granule(size, self.setup.page) } else { self.setup.page };
        let order = self.next_order << ORDER_SHIFT;
        self.next_order = (self.next_order + 1) % (1 << (64 - ORDER_SHIFT));
        let seg = Segment {
            addr,
            size,
            order,
            pool,
            stream,
            head: None,
            tail: None,
            granule,
            uniform_end: size,
            grown: Vec::new(),
            grown_at_page: Vec::new(),
            page_shift: self.setup.page.trailing_zeros(),
            room,
            growable,
            unmapped_pages: vec![0; size.div_ceil(granule).div_ceil(64) as usize],
            mapped: size,
            live: true,
        };
        let s = self.new_segment(seg);
        let b = self.new_block(Block::fresh(addr, size, s, pool, stream, None));
        self.segments[s].head = Some(b);
        self.segments[s].tail = Some(b);
        self.note(Note::SegmentReserved { addr, size, pool, stream, growable });
        // Indexed so that `take` can unindex it like any cached block.
        self.index_free(b);
        b
    }

    fn oom(&mut self, backend: &dyn Backend, requested: u64, rounded: u64, cause: BackendError) -> Error {
        self.note(Note::Oom { requested, device_free: backend.free_memory() });
        let largest = self.largest_free();
        Error::OutOfMemory(Box::new(OomReport {
            device: self.setup.device,
            requested,
            rounded,
            capacity: backend.total_memory(),
            free: backend.free_memory(),
            allocated: self.accounting.stats().allocated_bytes.current(),
            reserved: self.reserved(),
            largest_free_block: largest,
            allowed: self.limit.cap(),
            backend_message: cause.to_string(),
            snapshot_path: None,
            snapshot_error: None,
        }))
    }

    // ----- freeing ----------------------------------------------------------------------

    /// [`free`](Self::free) of a block whose free a thread logged already (a parked block:
    /// see `alloc::park`), or that was parked while nothing was recorded: no history event.
    pub(crate) fn free_unrecorded(&mut self, backend: &dyn Backend, i: BlockId) {
        self.accounting.free_logged_elsewhere(true);
        self.free(backend, i, None);
        self.accounting.free_logged_elsewhere(false);
    }

    /// The buffer of block `i` was dropped: stop counting it as allocated, and either return it
    /// to the free index or wait for the other streams that used it.
    pub(crate) fn free(&mut self, backend: &dyn Backend, i: BlockId, ctx: Option<Context>) {
        let (pool, size, requested, extra) = {
            let b = &mut self.blocks[i];
            debug_assert_eq!(b.state, BlockState::Allocated);
            b.ctx = None;
            // The bytes asked for stay on the block while it waits for other streams (a
            // snapshot shows them, as PyTorch's does); `deactivate` clears them.
            (b.pool, b.size, b.requested, b.extra.take())
        };
        let (handed_back, clean, lent_to, waiting) = match extra {
            None => (false, false, None, 0),
            Some(e) => match self.free_used_elsewhere(backend, i, e) {
                Ok(done) => done,
                Err(lent_to) => {
                    let (addr, stream) = (self.blocks[i].addr, lent_to.unwrap_or(self.blocks[i].stream));
                    self.note(Note::Release { addr, size, requested, pool, stream, ctx, waiting: true });
                    return;
                }
            },
        };
        let b = &mut self.blocks[i];
        let (addr, stream) = (b.addr, lent_to.unwrap_or(b.stream));
        if waiting > 0 {
            b.state = BlockState::PendingFree;
            b.pending_events = waiting;
        }
        self.note(Note::Release { addr, size, requested, pool, stream, ctx, waiting: waiting > 0 });
        if waiting == 0 && (handed_back || self.blocks[i].view) {
            // Back among its owner's free blocks, the block freed last left as it was (as when
            // a wait completes: see `event_done`).
            if !clean {
                self.streams.note_freed(self.blocks[i].stream);
            }
            self.finish_free(i);
        } else if waiting == 0 {
            self.streams.note_freed(self.blocks[i].stream);
            self.settle();
            self.deactivate(i);
            // Kept aside for a request of the same size (the common alloc-free-alloc of a
            // temporary); any other operation merges it first.
            self.hot = Some(i);
        }
    }

    /// [`Heap::free`]'s part for a block with an [`Extra`] (lent, or used on other streams):
    /// gives a loan back ([`Heap::hand_back`]) and records an event on each stream still to
    /// wait for. Returns whether the block went back to its owner, whether cleanly, the
    /// borrower, and the events to wait for; `Err(borrower)` where the block is kept out of
    /// use (no event could be recorded and the stream not synchronized). Apart from `free` so
    /// that a block without one, most of them, runs none of it.
    #[inline(never)]
    fn free_used_elsewhere(
        &mut self,
        backend: &dyn Backend,
        i: BlockId,
        mut extra: Box<Extra>,
    ) -> Result<(bool, bool, Option<StreamId>, u32), Option<StreamId>> {
        let lent = extra.lent_to.map(|to| (to, extra.from_range, extra.used_by_owner));
        let (handed_back, clean) = self.hand_back(backend, i, &mut extra.uses, lent);
        let lent_to = lent.map(|(to, _, _)| to);
        let mut waiting = 0;
        for &s in &extra.uses {
            let raw = self.streams[s.index()].raw;
            match backend.record_event(raw) {
                Ok(event) => {
                    self.streams.wait_for(event, i, s);
                    waiting += 1;
                }
                Err(e) => {
                    // Without an event, wait for the stream itself before reuse.
                    self.note(Note::BackendError);
                    if let Err(e2) = backend.synchronize(raw) {
                        self.accounting.keep_error(format!(
                            "block {:#x}: recording an event failed ({e}) and so did synchronizing ({e2}); \
                             the block is kept out of use",
                            self.blocks[i].addr
                        ));
                        self.blocks[i].state = BlockState::Stranded;
                        // The events recorded for its earlier streams are still pending and
                        // count down as they complete (the block stays out of use).
                        self.blocks[i].pending_events = waiting;
                        return Err(lent_to);
                    }
                }
            }
        }
        self.recycle_extra(extra);
        Ok((handed_back, clean, lent_to, waiting))
    }

    /// Merges the block kept aside by the last free, if any, as freeing it at once would have:
    /// after this the heap is exactly as without the shortcut. Every operation other than
    /// `alloc` and `free` starts with it (through `CachingAllocator`'s lock).
    #[inline]
    pub(crate) fn settle(&mut self) {
        if let Some(h) = self.hot.take() {
            self.merge_free(h);
        }
    }

    /// Sets every peak statistic to its current value as after [`Heap::settle`], without
    /// settling (a reset of the peaks is a read's neighbour: it must not change where blocks
    /// go either). Merging the block kept aside then leaves each inactive-split peak at its
    /// current value, as a reset after the merge would.
    pub(crate) fn reset_peaks(&mut self) {
        let settled = self.hot.map(|_| self.settled_stats());
        self.accounting.reset_peaks(settled);
    }

    /// The block the last free kept aside, if any: no longer live, not yet merged.
    pub(crate) fn kept_aside(&self) -> Option<BlockId> {
        self.hot
    }

    /// What [`Heap::settle`] would make of the block kept aside, without merging it: the
    /// free neighbours it would absorb and the free block it would become. Reads (statistics,
    /// snapshots, the largest free block) show the heap through this, so that reading never
    /// merges the block and so never changes which block the next request gets.
    pub(crate) fn hot_merge(&self) -> Option<HotMerge> {
        let hot = self.hot?;
        let b = &self.blocks[hot];
        let free = |n: Option<BlockId>| n.filter(|&n| self.blocks[n].state == BlockState::Free);
        let (prev, next) = (free(b.prev), free(b.next));
        let first = prev.unwrap_or(hot);
        let last = next.unwrap_or(hot);
        let size = [prev, next].into_iter().flatten().map(|n| self.blocks[n].size).sum::<u64>() + b.size;
        Some(HotMerge {
            hot,
            prev,
            next,
            addr: self.blocks[first].addr,
            size,
            split: self.blocks[first].prev.is_some() || self.blocks[last].next.is_some(),
        })
    }

    /// The statistics as they would be after [`Heap::settle`]: those of the blocks that
    /// merging changes (inactive split blocks) counted as `merge_free` counts them, on a copy.
    pub(crate) fn settled_stats(&self) -> Stats {
        let mut st = self.accounting.stats().clone();
        if let Some(m) = self.hot_merge() {
            let pool = self.blocks[m.hot].pool;
            // `merge_free`'s order: the neighbours uncounted (each counted only if split,
            // which a neighbour of the kept block always is), then the merged block counted.
            for n in [m.prev, m.next].into_iter().flatten() {
                st.inactive_split.dec(pool, 1);
                st.inactive_split_bytes.dec(pool, self.blocks[n].size);
            }
            if m.split {
                st.inactive_split.inc(pool, 1);
                st.inactive_split_bytes.inc(pool, m.size);
            }
        }
        st
    }

    /// The block is no longer used by any stream: merge it into a free neighbour (whose index
    /// entry is resized, usually in place) or index it.
    fn finish_free(&mut self, i: BlockId) {
        self.deactivate(i);
        if self.blocks[i].view {
            self.let_view_go(i);
            return;
        }
        self.merge_free(i);
    }

    /// Takes block `i` out of the active statistics: no stream uses it any more.
    fn deactivate(&mut self, i: BlockId) {
        let b = &mut self.blocks[i];
        b.requested = 0;
        let (pool, size) = (b.pool, b.size);
        self.note(Note::Deactivate { size, pool });
    }

    /// Puts block `i` (no longer in use, its statistics already moved) back among the free
    /// blocks, merged with its free neighbours.
    fn merge_free(&mut self, i: BlockId) {
        let seg = self.blocks[i].segment;
        let size = self.blocks[i].size;
        let prev = self.blocks[i].prev;
        let next = self.blocks[i].next;
        let free = |b: Option<BlockId>| b.filter(|&b| self.blocks[b].state == BlockState::Free);
        let (prev_free, next_free) = (free(prev), free(next));
        if let Some(prev) = prev_free {
            self.uncount_split(prev);
            self.absorb(prev, i);
            if let Some(next) = next_free {
                self.unindex_free(next);
                self.absorb(prev, next);
            }
            let size = self.blocks[prev].size;
            let flags = self.free_flags(prev);
            let key = self.order_key(prev);
            self.free.update(prev, size, key, flags);
            self.count_split(prev);
        } else if let Some(next) = next_free {
            self.uncount_split(next);
            let (addr, unmapped) = (self.blocks[i].addr, self.blocks[i].unmapped);
            let n = &mut self.blocks[next];
            n.addr = addr;
            n.size += size;
            n.prev = prev;
            n.unmapped |= unmapped;
            let new_size = n.size;
            match prev {
                None => self.segments[seg].head = Some(next),
                Some(prev) => self.blocks[prev].next = Some(next),
            }
            self.drop_block(i);
            let flags = self.free_flags(next);
            let key = self.order_key(next);
            self.free.update(next, new_size, key, flags);
            self.count_split(next);
        } else {
            self.index_free(i);
        }
    }

    /// Merges block `b` (the right neighbour) into block `a`.
    fn absorb(&mut self, a: BlockId, b: BlockId) {
        let (bsize, bnext, bunmapped) = {
            let bb = &self.blocks[b];
            (bb.size, bb.next, bb.unmapped)
        };
        let ab = &mut self.blocks[a];
        ab.size += bsize;
        ab.next = bnext;
        ab.unmapped |= bunmapped;
        match bnext {
            Some(bnext) => self.blocks[bnext].prev = Some(a),
            None => {
                let seg = self.blocks[a].segment;
                self.segments[seg].tail = Some(a);
            }
        }
        self.drop_block(b);
    }

    // ----- what the allocator's handle reads and sets --------------------------------------

    pub(crate) fn device(&self) -> usize {
        self.setup.device
    }

    pub(crate) fn config(&self) -> &AllocatorConfig {
        &self.setup.config
    }

    pub(crate) fn stats(&self) -> &Stats {
        self.accounting.stats()
    }

    pub(crate) fn recorder(&self) -> &Recorder {
        self.accounting.recorder()
    }

    /// The public reset of the accumulated counters.
    pub(crate) fn reset_accumulated(&mut self) {
        self.accounting.reset_accumulated();
    }

    /// Stores a captured stack in the recorder's tables, for the context of an operation.
    pub(crate) fn intern(&mut self, p: Pending) -> Context {
        self.accounting.intern(p)
    }

    pub(crate) fn set_record_config(&mut self, config: RecordConfig) {
        self.accounting.set_record_config(config);
    }

    pub(crate) fn clear_history(&mut self) {
        self.accounting.clear_history();
    }

    /// Records that a snapshot was taken (PyTorch's `snapshot` entry).
    pub(crate) fn note_snapshot(&mut self) {
        self.note(Note::Snapshot);
    }

    /// The last error a `Drop` (or a background step) could not report.
    pub(crate) fn last_error(&self) -> Option<&str> {
        self.accounting.last_error()
    }

    pub(crate) fn set_last_error(&mut self, message: String) {
        self.accounting.keep_error(message);
    }

    /// The tensor description of allocated block `b`.
    pub(crate) fn tensor_meta(&self, b: BlockId) -> Option<TensorMeta> {
        self.blocks[b].extra.as_ref()?.meta.clone()
    }

    pub(crate) fn set_tensor_meta(&mut self, b: BlockId, meta: TensorMeta) {
        self.extra_mut(b).meta = Some(meta);
    }
}

#[cfg(test)]
mod tests;
