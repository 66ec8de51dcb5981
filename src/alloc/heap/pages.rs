//! Reclaiming memory: the soft limit, releasing cached segments, and unmapping and mapping
//! the pages under free blocks.

use super::accounting::Note;
use super::Heap;
use crate::alloc::ids::{BlockId, SegmentId, StreamId};
use crate::backend::Backend;
use crate::error::BackendError;

/// The block kept aside by the last free, whose merge [`Heap::grow`] defers (see
/// [`Heap::deferred_hot`]), and the free remainder of its segment.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deferred {
    pub(super) hot: BlockId,
    rest: BlockId,
    /// Their segment.
    segment: SegmentId,
    /// Their sum: the whole segment.
    pub(super) segment_size: u64,
}

/// What ordering a stream after another is for, where a segment changes stream.
const TAKE_OVER: &str = "to take over its cached segment";

/// On a heap whose one stream holds every segment, a request that finds no cached block and
/// is over the soft limit gives back no whole cached segment larger than this many times what
/// it lacks; past that it grows over the limit by what it lacks.
///
/// Why: the smallest whole free segment is often much larger than what the request needs (a
/// 2 MiB segment for a small tensor), and it is cached because the loop used it: releasing a
/// 228 MiB segment to make room for 2 MiB saves 2 MiB for a moment and costs a reservation of
/// that segment again when its request comes back in the same step, pass after pass, which the
/// churn rule of [`Heap::note_regrowth`] does not always see (a raise for the small request
/// consumes the record of the release). Growing by the 2 MiB instead overshoots the limit by at
/// most the request's own segment, which the loop reuses. Any factor from 2 to 16 gave the
/// same late calls on the random single-stream traces (BENCHMARKS.md, "Reclaim in proportion");
/// on several streams, where releasing is also how memory passes between streams, the rule
/// left more rows calling late and is not applied.
///
/// Likewise, smallest first, a large request released the small pool's 2 MiB segments before
/// anything else: each gives back 2 MiB against the hundreds the request needs, and the small
/// tensors of the next step reserve it again. A request that needs more than a small segment
/// releases none of the small pool's, on any number of streams. (Held only where one stream
/// held every segment, the rule left twice the warm calls of random shapes on several streams
/// and more rows calling after two warm passes: BENCHMARKS.md.)
const RELEASE_SPAN: u64 = 8;

/// What a reclaim may give back (see [`Heap::reclaim`]): which whole free segments, and
/// whether the pages under free holes.
#[derive(Debug, Clone, Copy)]
struct Releasable {
    /// The largest whole segment, mapped bytes.
    largest: u64,
    /// Whether segments of the small pool.
    small_pool: bool,
    /// Whether the pages under free holes: only where the request's stream holds every
    /// segment (see [`Heap::reclaim`]).
    holes: bool,
}

impl Heap {
    pub(crate) fn reserved(&self) -> u64 {
        self.accounting.stats().reserved_bytes.current()
    }

    /// Reserved bytes above which the allocator reclaims before growing (see
    /// [`Limit::soft`](super::limit::Limit::soft)).
    pub(super) fn soft_limit(&self, backend: &dyn Backend, size: u64) -> u64 {
        let threshold = self.setup.config.garbage_collection_threshold;
        self.limit.soft(self.accounting.stats().allocated_bytes.current(), size, threshold, || backend.total_memory())
    }

    /// Refuses, as the backend refuses a request when the device is full, `more` bytes that
    /// would take reserved past the cap (`per_process_memory_fraction`). Every request for
    /// memory from the backend goes through here first (a new segment, a growth in place, the
    /// pages of a cached block), so that a refusal takes the same road as the device's own:
    /// the cache is given back and the request retried, then out of memory.
    pub(super) fn within_cap(&self, more: u64) -> Result<(), BackendError> {
        self.limit.within_cap(self.reserved(), more)
    }

    /// The fragmentation limit in force (it rises from the configured one on churn).
    pub(crate) fn fragmentation_limit(&self) -> Option<f64> {
        self.limit.factor()
    }

    /// Called before asking the backend for `need` bytes to serve a request of `size` bytes (a
    /// new segment, a growth, or the unmapped pages of a cached block). If the allocator gave
    /// back, since the last peak of allocated bytes, a free piece that would have covered the
    /// request, holding to the limit made it churn: raise the limit to what growing by `need`
    /// bytes without reclaiming takes, or to what the reclaims that gave memory back since that
    /// peak wanted where that is more (at least 0.5% more, doubled for each raise since the
    /// last peak: a loop that churns again after a raise needs more headroom than the raise
    /// gave, and geometric steps reach it in few churns), up to `fragmentation_limit_max`.
    ///
    /// The reclaims' want counts whether or not this growth fits under the limit. Counted only
    /// where it did, the limit would rise only to this growth, and two requests that took turns mapping pages the other's reclaim had unmapped
    /// would churn again after each raise, into a third warm pass on 2 of 300 single-stream
    /// random traces (`tests/replay.rs`,
    /// `random_shapes_on_one_stream_settle_by_the_second_warm_pass`).
    ///
    /// The request is compared by its size. Until no hole was unmapped on several streams
    /// ([`Heap::reclaim`]), a request of a stream that shared the heap was compared by the
    /// pages it lacked: a hole a reclaim had unmapped often merged with neighbours freed since,
    /// and the request that mapped those pages again was larger than any piece given back
    /// (BENCHMARKS.md, "Churn in a hole that merged"). With no hole unmapped there, that
    /// comparison changed no decision in 1,972 replays (986 fixture and random traces, both
    /// segment kinds), and went.
    pub(super) fn note_regrowth(&mut self, size: u64, need: u64) {
        if self.limit.note_regrowth(size, need, self.accounting.stats().allocated_bytes.current(), self.reserved()) {
            self.note(Note::LimitRaised);
        }
    }

    /// Gives cached memory back until `reserved + need <= limit` or nothing is left to give:
    /// whole free segments first (smallest first), then, with `alone`, the pages under free
    /// holes. With `exact` (`need` is exactly the pages the request lacks: a growth in place or
    /// a block's unmapped pages, not a new segment's rounded size), what reserved would have
    /// had to reach to give nothing back is kept for [`Heap::note_regrowth`].
    ///
    /// In proportion to the request: for a request that needs more than a small segment, no
    /// segment of the small pool is released; with `alone` (the request's stream holds every
    /// segment), no whole segment larger than [`RELEASE_SPAN`] times `need` either (the request
    /// then grows past the limit by what it lacks instead; see [`RELEASE_SPAN`]); and of a hole
    /// only the granules that reserved exceeds the limit by are unmapped, from the hole's end,
    /// not every one: in a range that grows in place the largest hole is often most of the
    /// range, which the same step maps again.
    ///
    /// Where other streams hold segments too, no hole is unmapped: memory passes between
    /// streams as lent blocks and whole segments, and a hole unmapped for one stream's request
    /// lies in a segment whose own stream fills it again within the loop, mapping the pages back
    /// (and, over the limit, unmapping another hole for them), where a hole kept mapped is
    /// there to lend. On 480 traces of random shapes on two to four streams (the multi-stream
    /// ones of `tests/gpu/random_streams.py`'s seeds 1000–1239, 6000–6239, 7000–7239 and
    /// 8000–8239, the last never replayed before), replayed as on CUDA with virtual segments, this
    /// halved the warm passes' driver calls (4,938 to 2,296), left 47 rows calling after the
    /// second warm pass instead of 89, and lowered the geometric mean of the peaks on every set
    /// (BENCHMARKS.md, "No hole unmapped on several streams"). The pages of holes still go back
    /// at `empty_cache` and before an out-of-memory error ([`Heap::release_cache`]).
    pub(super) fn reclaim(&mut self, backend: &dyn Backend, need: u64, limit: u64, exact: bool, alone: bool) {
        // What is released or unmapped may hold loans given back unasked, the requesting
        // stream's own too (`take` maps pages and may reclaim for them outside `grow`).
        if self.streams.any_unchecked() {
            self.check_returns(backend, 0);
        }
        let before = self.reserved();
        let releasable = Releasable {
            largest: if alone { need.saturating_mul(RELEASE_SPAN) } else { u64::MAX },
            small_pool: need <= super::SMALL_SEGMENT,
            holes: alone,
        };
        self.give_back(backend, need, limit, releasable);
        if exact && self.reserved() < before {
            self.limit.note_wanted(before + need);
        }
    }

    /// [`Heap::reclaim`]'s work.
    fn give_back(&mut self, backend: &dyn Backend, need: u64, limit: u64, releasable: Releasable) {
        let mut whole: Vec<(u64, u64, BlockId)> = (self.free.whole().iter())
            .map(|&b| (self.segments[self.blocks[b].segment].mapped, self.order_key(b), b))
            .collect();
        whole.sort_unstable();
        for (mapped, _, b) in whole {
            if self.reserved() + need <= limit || mapped > releasable.largest {
                // Sorted by size: every segment after one too large is too large.
                break;
            }
            if !releasable.small_pool && self.segments[self.blocks[b].segment].pool == super::Pool::Small {
                continue;
            }
            let size = self.blocks[b].size;
            if self.release_segment_of(backend, b) {
                self.limit.note_released(size);
            }
        }
        if self.setup.can_unmap && releasable.holes && self.reserved() + need > limit {
            // Largest holes first: they give back the most pages per call.
            let mut holes: Vec<(u64, u64, BlockId)> =
                (self.free.with_mapped_pages().iter()).map(|&b| (self.blocks[b].size, self.order_key(b), b)).collect();
            holes.sort_unstable_by(|x, y| y.cmp(x));
            for (_, _, b) in holes {
                if self.reserved() + need <= limit {
                    return;
                }
                let size = self.blocks[b].size;
                // Only what the request lacks under the limit: the rest stays mapped for the
                // requests of the same step that the hole serves.
                let want = (self.reserved() + need).saturating_sub(limit);
                if self.unmap_block(backend, b, want) {
                    self.limit.note_released(size);
                }
            }
        }
    }

    /// Whether block `b` is free and its segment's only block.
    pub(super) fn whole_free(&self, b: BlockId) -> bool {
        let blk = &self.blocks[b];
        blk.state == super::BlockState::Free && blk.prev.is_none() && blk.next.is_none()
    }

    /// Segment `s` moves from stream `from` to stream `to` (its blocks' streams set by the
    /// caller, with `to`'s work already ordered after `from`'s); returns its pool.
    fn move_segment(&mut self, s: SegmentId, from: StreamId, to: StreamId) -> super::Pool {
        // Memory joins `to`'s free blocks (ordered after `from`'s work, not after anything
        // `to` was seen idle before).
        self.streams.note_freed(to);
        let seg = &mut self.segments[s];
        seg.stream = to;
        let (addr, size, pool, growable) = (seg.addr, seg.size, seg.pool, seg.growable);
        self.note(Note::SegmentAdopted { addr, size, pool, from, to, growable });
        pool
    }

    /// Moves whole free segment `b` of another stream to `stream`, with `stream`'s work
    /// ordered after the old stream's so that nothing it queued can still touch the memory
    /// when the new owner's work runs (`Backend::order_after`); false if the backend could not
    /// order them.
    pub(super) fn take_over(&mut self, backend: &dyn Backend, b: BlockId, stream: StreamId) -> bool {
        let old = self.blocks[b].stream;
        if !self.order_streams(backend, stream, old, TAKE_OVER) {
            return false;
        }
        self.blocks[b].stream = stream;
        let pool = self.move_segment(self.blocks[b].segment, old, stream);
        // Moved between the streams' bins in one step: a whole segment stays free, whole
        // and unsplit, so its flags and counters do not change.
        self.free.rehome(b, pool as usize, stream.0);
        true
    }

    /// The hand-off: whether the block kept aside by the last free (see [`Heap::settle`])
    /// would, merged, be a whole segment that a request of `size` bytes in `pool` on another
    /// stream takes over, over the soft limit: a block of exactly that size at the segment's
    /// start whose only neighbour is a free remainder that `take` would split off again. The
    /// case is a temporary allocated and freed on each of many streams in turn (a stream per
    /// request): the segment follows the temporary from stream to stream, each new stream
    /// ordered after the last, where lending it (see [`Heap::lendable`]) would order the first
    /// stream after every later one at each free.
    ///
    /// No other whole segment changes stream over the limit (idle streams' aside, see
    /// [`Heap::adopt`]): a stream that still works and gave its cached segment away needs
    /// memory again later in its loop and takes another's, so segments wander between the
    /// streams and the heap keeps calling the backend pass after pass; lent blocks go back to
    /// their owner at their free, which settles (BENCHMARKS.md, "Lending instead of taking
    /// over").
    ///
    /// [`Heap::grow`] takes the segment over without merging and splitting (which would
    /// restore the very same two blocks); any other outcome settles first, before the step
    /// that could see the difference. The heap's state after the request is the same as
    /// merging first and taking over the merged segment, [`Heap::take_over_merged`]
    /// (`tests::deferred_takeover_is_the_merge_and_split`).
    pub(super) fn deferred_hot(&self, pool: super::Pool, stream: StreamId, size: u64) -> Option<Deferred> {
        let hot = self.hot?;
        let h = &self.blocks[hot];
        if h.stream == stream || h.size != size || h.pool != pool || h.prev.is_some() {
            return None;
        }
        let rest = h.next?;
        let r = &self.blocks[rest];
        if r.state != super::BlockState::Free || r.next.is_some() || r.unmapped {
            return None;
        }
        let segment_size = h.size + r.size;
        // `take` splits the merged segment at `size` again (its rules, with the remainder).
        let splits = self.splits(h.segment, r.size, segment_size);
        splits.then_some(Deferred { hot, rest, segment: h.segment, segment_size })
    }

    /// Takes over the segment of the deferred block for `stream`, handing out the block as it
    /// lies (see [`Heap::deferred_hot`]). If the old stream cannot be waited for, merges the
    /// block (as [`Heap::take_over_merged`], which would have failed the same way) and
    /// returns `None`.
    pub(super) fn take_over_deferred(
        &mut self,
        backend: &dyn Backend,
        d: Deferred,
        stream: StreamId,
    ) -> Option<BlockId> {
        debug_assert_eq!(self.hot, Some(d.hot));
        let old = self.blocks[d.hot].stream;
        if !self.order_streams(backend, stream, old, TAKE_OVER) {
            self.settle();
            return None;
        }
        self.hot = None;
        self.blocks[d.hot].stream = stream;
        self.blocks[d.rest].stream = stream;
        let pool = self.move_segment(d.segment, old, stream);
        // The remainder keeps its size and flags, as after a merge and a split; it left the
        // inactive-split counters at the merge and came back at the split, which the
        // cumulative totals count.
        self.uncount_split(d.rest);
        self.count_split(d.rest);
        self.free.rehome(d.rest, pool as usize, stream.0);
        Some(d.hot)
    }

    /// What [`Heap::take_over_deferred`] does, the slow way: with the block freed last already
    /// merged (`settle`: at a sweep, and always in the heaps that test the hand-off, with
    /// `defer_hot` off), takes over the whole segment `d` names, for `take` to split; `None`
    /// where the segment is no longer a whole free one of another stream (the sweep
    /// that merged the block may have released or offered it).
    pub(super) fn take_over_merged(&mut self, backend: &dyn Backend, d: Deferred, stream: StreamId) -> Option<BlockId> {
        debug_assert!(self.hot.is_none());
        let seg = &self.segments[d.segment];
        let b = seg.head.filter(|_| seg.live)?;
        if !self.whole_free(b) || self.blocks[b].segment != d.segment || self.blocks[b].stream == stream {
            return None;
        }
        self.take_over(backend, b, stream).then_some(b)
    }

    /// Releases everything cached: every fully free segment and, with `pages`, the pages under
    /// the other free blocks.
    pub(crate) fn release_cache(&mut self, backend: &dyn Backend, pages: bool) {
        self.check_returns(backend, 0);
        self.synchronize_pending(backend);
        // Idle views hold no memory but their addresses: given back too (`alias.rs`).
        self.drop_views(backend, None, 0, u64::MAX);
        let whole = self.free.whole().to_vec();
        for b in whole {
            self.release_segment_of(backend, b);
        }
        if pages && self.setup.can_unmap {
            let holes = self.free.with_mapped_pages().to_vec();
            for b in holes {
                self.unmap_block(backend, b, u64::MAX);
            }
        }
    }

    /// At the allocator's end, when no buffer exists: gives back every segment still held,
    /// those whose blocks are kept out of use included (a free whose event and synchronize
    /// both failed, or a wait that could not be completed), and destroys the events still
    /// pending. The backend waits for any work still queued on them, as
    /// [`Backend::release`] promises, so nothing is reused early; without this such segments
    /// stayed reserved until the process ended.
    pub(crate) fn release_everything(&mut self, backend: &dyn Backend) {
        for p in self.streams.take_pending() {
            backend.destroy_event(p.event);
        }
        // SAFETY: no buffer exists (the allocator's last reference is gone).
        unsafe { self.give_back_views(backend) };
        let held: Vec<(SegmentId, u64, u64)> =
            self.segments.iter().filter(|(_, s)| s.live).map(|(i, s)| (i, s.addr, s.size)).collect();
        for (i, addr, size) in held {
            // SAFETY: no buffer exists (the allocator's last reference is gone), so nothing on
            // the host uses the segment; it is live, reserved from this backend with this size,
            // and released once (marked below); queued device work is the backend's to wait for.
            if let Err(e) = unsafe { backend.release(addr, size) } {
                self.note(Note::BackendError);
                self.accounting.keep_error(format!("releasing segment {addr:#x}: {e}"));
            }
            self.segments[i].live = false;
        }
    }

    /// Releases the segment whose only block is the free block `b`; false if the backend
    /// refused.
    pub(super) fn release_segment_of(&mut self, backend: &dyn Backend, b: BlockId) -> bool {
        let s = self.blocks[b].segment;
        let (addr, size, pool, mapped, growable) = {
            let seg = &self.segments[s];
            (seg.addr, seg.size, seg.pool, seg.mapped, seg.growable)
        };
        // The segment is wholly free, so its views are idle: given back first.
        if self.views.any() && !self.drop_views(backend, Some(s), addr, addr + size) {
            return false;
        }
        // SAFETY: `b` is free and indexed, so no buffer holds any of the segment (its only
        // block), and the segment is live, reserved from this backend with this size.
        if let Err(e) = unsafe { backend.release(addr, size) } {
            self.note(Note::BackendError);
            self.accounting.keep_error(format!("releasing segment {addr:#x}: {e}"));
            return false;
        }
        self.unindex_free(b);
        let stream = self.blocks[b].stream;
        self.drop_block(b);
        self.note(Note::SegmentReleased { addr, size, mapped, pool, stream, growable });
        let seg = &mut self.segments[s];
        seg.live = false;
        seg.unmapped_pages = Vec::new();
        self.segments.release(s);
        true
    }

    /// Unmaps whole granules inside free block `b`, from its end, until at least `want` bytes
    /// were unmapped or none is left mapped; true if any was unmapped.
    fn unmap_block(&mut self, backend: &dyn Backend, b: BlockId, want: u64) -> bool {
        let blk = &self.blocks[b];
        let s = blk.segment;
        let seg = &self.segments[s];
        let inside = seg.granules_inside(blk.addr, blk.size);
        let raw_stream = self.streams[seg.stream.index()].raw;
        if inside.is_empty() {
            return false;
        }
        let mut any = false;
        let mut left = want;
        for (start, stop) in self.page_runs(s, inside.start, inside.end, false).into_iter().rev() {
            if left == 0 {
                break;
            }
            // The run's last granules, as many as `left` asks for.
            let mut first = stop;
            while first > start && left > 0 {
                first -= 1;
                left = left.saturating_sub(self.segments[s].granule_span(first, first + 1).1);
            }
            let start = first;
            let (addr, len) = self.segments[s].granule_span(start, stop);
            // Idle views over these pages go first: a page a view maps cannot be unmapped.
            if self.views.any() && !self.drop_views(backend, Some(s), addr, addr + len) {
                break;
            }
            // SAFETY: whole granules inside free block `b` of a live segment, mapped (the runs
            // asked for), so no buffer holds any of their bytes; work queued on the segment's
            // stream (where the blocks were freed) is the backend's to order the unmap after,
            // and work of other streams was waited for before the blocks became free.
            if let Err(e) = unsafe { backend.unmap(addr, len, raw_stream) } {
                self.note(Note::BackendError);
                self.accounting.keep_error(format!("unmapping {len} bytes at {addr:#x}: {e}"));
                break;
            }
            self.set_pages(s, start..stop, true);
            any = true;
        }
        if any {
            self.blocks[b].unmapped = true;
            self.reflag(b);
        }
        any
    }

    /// Maps every unmapped granule touching `[addr, addr + len)` of block `b`'s segment; on a
    /// refusal, releases the cache and retries once.
    pub(super) fn ensure_mapped(
        &mut self,
        backend: &dyn Backend,
        b: BlockId,
        addr: u64,
        len: u64,
    ) -> Result<(), BackendError> {
        let s = self.blocks[b].segment;
        let touching = self.segments[s].granules_touching(addr, len);
        let (first, end) = (touching.start, touching.end);
        let missing: u64 =
            touching.filter(|&p| self.page_unmapped(s, p)).map(|p| self.segments[s].granule_span(p, p + 1).1).sum();
        if missing == 0 {
            return Ok(());
        }
        let alone = self.holds_every_segment_of_both(self.blocks[b].stream);
        self.note_regrowth(len, missing);
        let limit = self.soft_limit(backend, len);
        if self.reserved() + missing > limit {
            self.reclaim(backend, missing, limit, true, alone);
        }
        for (start, stop) in self.page_runs(s, first, end, true) {
            // One mapping per granule: the unit that unmapping gives back. The run's granules
            // count in reserved only once the run is mapped.
            let mut run = 0;
            for p in start..stop {
                let (a, l) = self.segments[s].granule_span(p, p + 1);
                if let Err(e) = self.within_cap(run + l).and_then(|()| backend.map(a, l)) {
                    self.note(Note::Retry);
                    self.release_cache(backend, true);
                    if self.within_cap(run + l).and_then(|()| backend.map(a, l)).is_err() {
                        // The run's granules mapped so far are mapped: count them.
                        if p > start {
                            self.set_pages(s, start..p, false);
                        }
                        return Err(e);
                    }
                }
                run += l;
            }
            self.set_pages(s, start..stop, false);
        }
        Ok(())
    }

    fn page_unmapped(&self, s: SegmentId, p: u64) -> bool {
        Self::is_page_unmapped(&self.segments[s], p)
    }

    /// The maximal runs `[start, stop)` of pages in `[first, end)` of segment `s` whose
    /// unmapped bit equals `unmapped`.
    pub(super) fn page_runs(&self, s: SegmentId, first: u64, end: u64, unmapped: bool) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut p = first;
        while p < end {
            if self.page_unmapped(s, p) != unmapped {
                p += 1;
                continue;
            }
            let start = p;
            while p < end && self.page_unmapped(s, p) == unmapped {
                p += 1;
            }
            runs.push((start, p));
        }
        runs
    }

    /// Marks granules unmapped (or mapped) and moves their bytes out of (or into) reserved.
    fn set_pages(&mut self, s: SegmentId, pages: std::ops::Range<u64>, unmapped: bool) {
        let (addr, len) = self.segments[s].granule_span(pages.start, pages.end);
        let seg = &mut self.segments[s];
        for p in pages {
            let w = &mut seg.unmapped_pages[(p / 64) as usize];
            if unmapped {
                *w |= 1 << (p % 64);
            } else {
                *w &= !(1 << (p % 64));
            }
        }
        let (pool, stream) = (seg.pool, seg.stream);
        if unmapped {
            seg.mapped -= len;
        } else {
            seg.mapped += len;
        }
        // The range's own address, as PyTorch records `segment_map` and `segment_unmap`.
        self.note(Note::Pages { addr, len, pool, stream, mapped: !unmapped });
    }
}

#[cfg(test)]
mod tests {
    use super::super::Pool;
    use super::*;
    use crate::backend::SimBackend;
    use crate::config::AllocatorConfig;
    use crate::record::RecordConfig;

    const MIB: u64 = 1 << 20;

    /// A heap of `config` on a sim of 1 TiB, recording nothing.
    fn heap(config: &str) -> (Heap, SimBackend) {
        let sim = SimBackend::new(1 << 40);
        (Heap::new(0, AllocatorConfig::parse(config).unwrap(), RecordConfig::off(), &sim), sim)
    }

    /// A heap held to a limit of exactly its peak, a 200 MiB segment cached whole on stream 0,
    /// its 2 MiB small segment full (two 1 MiB blocks live).
    fn over_the_limit() -> (Heap, SimBackend) {
        let (mut h, sim) = heap("release_pages:false,fragmentation_limit:1.0,fragmentation_limit_max:off");
        let large = h.alloc(&sim, StreamId(0), 200 * MIB, None).unwrap();
        for _ in 0..2 {
            h.alloc(&sim, StreamId(0), MIB, None).unwrap();
        }
        h.free(&sim, large.block, None);
        h.settle();
        assert_eq!(h.reserved(), 202 * MIB);
        (h, sim)
    }

    #[test]
    fn a_small_request_alone_releases_no_segment_far_larger_than_it_lacks() {
        let (mut h, sim) = over_the_limit();
        // 2 MiB over the limit: releasing the 200 MiB segment would get under it, but that
        // segment is over `RELEASE_SPAN` times the 2 MiB the request lacks.
        h.alloc(&sim, StreamId(0), MIB, None).unwrap();
        assert_eq!(h.accounting.stats().num_device_free, 0);
        assert_eq!(h.reserved(), 204 * MIB);
        assert_eq!(sim.used_memory(), 204 * MIB);
        assert_eq!(h.accounting.stats().segment.pool_current(Pool::Large), 1, "still cached");
    }

    #[test]
    fn a_large_request_keeps_the_small_pools_segments() {
        for streams in [1, 2] {
            let (mut h, sim) = heap("release_pages:false,fragmentation_limit:1.0,fragmentation_limit_max:off");
            // Without a limit while the setup allocates: each stream reserves its own segment.
            let limit = h.limit.set_factor(None);
            if streams == 2 {
                // Stream 1's own small segment, in use.
                another_stream_holds_a_segment(&mut h, &sim);
            }
            let small = h.alloc(&sim, StreamId(0), MIB, None).unwrap();
            h.free(&sim, small.block, None);
            h.settle();
            h.limit.set_factor(limit);
            assert_eq!(h.accounting.stats().segment.pool_current(Pool::Small), streams);
            assert_eq!(h.holds_every_segment_of_both(StreamId(0)), streams == 1);
            // 100 MiB over a limit of 100 MiB: releasing a cached 2 MiB small segment would
            // not get under it anyway, and the next small tensor would reserve it again.
            h.alloc(&sim, StreamId(0), 100 * MIB, None).unwrap();
            assert_eq!(h.accounting.stats().num_device_free, 0, "{streams} streams");
            assert_eq!(h.accounting.stats().segment.pool_current(Pool::Small), streams, "still cached");
            assert_eq!(h.reserved(), (100 + 2 * streams) * MIB);
        }
    }

    /// Stream 1 allocates 512 bytes: it holds a segment (of the small pool), and stream 0 no
    /// longer holds them all.
    fn another_stream_holds_a_segment(h: &mut Heap, sim: &SimBackend) {
        h.add_stream(1).unwrap();
        h.alloc(sim, StreamId(1), 512, None).unwrap();
        assert!(!h.holds_every_segment_of_both(StreamId(0)));
    }

    #[test]
    fn on_several_streams_the_reclaim_still_releases_the_smallest_whole_segment() {
        let (mut h, sim) = over_the_limit();
        another_stream_holds_a_segment(&mut h, &sim);
        h.alloc(&sim, StreamId(0), MIB, None).unwrap();
        assert_eq!(h.accounting.stats().num_device_free, 1, "the 200 MiB segment went back");
        assert_eq!(h.accounting.stats().segment.pool_current(Pool::Large), 0);
    }

    /// A growing range holding two 100 MiB blocks, the first freed: a 100 MiB mapped hole
    /// before a live block, under a limit of 1.2 times the peak.
    fn a_mapped_hole() -> (Heap, SimBackend) {
        // Without views: a view of the hole's pages would serve the requests below (`alias.rs`).
        let (mut h, sim) =
            heap("release_pages:true,fragmentation_limit:1.2,fragmentation_limit_max:off,alias_pages:false");
        let a = h.alloc(&sim, StreamId(0), 100 * MIB, None).unwrap();
        h.alloc(&sim, StreamId(0), 100 * MIB, None).unwrap();
        h.free(&sim, a.block, None);
        h.settle();
        assert_eq!((h.reserved(), h.accounting.stats().num_device_alloc), (200 * MIB, 1));
        (h, sim)
    }

    #[test]
    fn a_request_unmaps_only_what_it_lacks_from_a_hole() {
        let (mut h, sim) = a_mapped_hole();
        // 150 MiB fits no hole: the range grows by 150 MiB, 50 MiB over the limit (1.2 times
        // the 250 MiB allocated then).
        h.alloc(&sim, StreamId(0), 150 * MIB, None).unwrap();
        assert_eq!(h.reserved(), 300 * MIB, "50 MiB of the hole unmapped, not all 100");
        assert_eq!(sim.used_memory(), 300 * MIB);
        // The hole's first 50 MiB stayed mapped: the next request of that size maps nothing.
        let maps = h.accounting.stats().num_device_map;
        h.alloc(&sim, StreamId(0), 50 * MIB, None).unwrap();
        assert_eq!(h.accounting.stats().num_device_map, maps);
        assert_eq!(h.reserved(), 300 * MIB);
    }

    #[test]
    fn on_several_streams_a_request_unmaps_no_hole() {
        let (mut h, sim) = a_mapped_hole();
        another_stream_holds_a_segment(&mut h, &sim);
        // Alone, the request unmaps 50 MiB of the hole (above). With stream 1's 2 MiB segment
        // beside it, the range grows past the limit (300 MiB) by the whole request instead,
        // and the hole stays mapped, to serve or lend.
        let (unmaps, maps) = (h.accounting.stats().num_device_unmap, h.accounting.stats().num_device_map);
        h.alloc(&sim, StreamId(0), 150 * MIB, None).unwrap();
        assert_eq!(h.accounting.stats().num_device_unmap, unmaps, "no page of the hole unmapped");
        assert!(h.accounting.stats().num_device_map > maps, "the range grew");
        assert_eq!(h.reserved(), 352 * MIB);
        assert_eq!(h.accounting.stats().num_device_free, 0, "stream 1's small segment stays");
        // The hole serves the next request of its size without a call.
        let before = h.accounting.stats().public().backend_memory_calls();
        h.alloc(&sim, StreamId(0), 100 * MIB, None).unwrap();
        assert_eq!(h.accounting.stats().public().backend_memory_calls(), before);
    }
}
