//! Aliasing on growth ([`AllocatorConfig::alias_pages`](crate::config::AllocatorConfig::alias_pages)):
//! where the range that grows in place would grow for a large request that none of its holes
//! fits, the request is served instead from the range's wholly free mappings, wherever they
//! lie, mapped once more, in order, at addresses of their own: a *view*.
//!
//! Why: a fixed layout (every block at one address for its life) can need more memory than the
//! peak of live bytes however blocks are placed: on `staggered_buffers` every layout needs
//! 1.25 times it (`tests/gpu/staggered_bound.py`), and a range that only grows pays that. The
//! free memory of the range adds up to what the request needs although no hole is long enough;
//! a view makes it contiguous without moving a byte. The rule is the one
//! `tests/gpu/alias_model.py` models, predeclared before it was measured: a request over 1 MiB
//! that no hole fits and that would grow the range by `lacks` bytes takes the range's first
//! wholly free mappings (in address order) until they hold its size in whole pages (`need`),
//! where that maps fewer new bytes than growing would, `max(0, need - free) < lacks`;
//! otherwise the range grows as before (`BENCHMARKS.md`, "A trace no fixed layout fits").
//!
//! What a view can map: only whole mappings (CUDA maps a physical allocation from its start
//! only), so the range maps its memory as it would without views, in the granules of each
//! growth ([`map_granule`](crate::backend::map_granule): a page for growths under 128 MiB, at
//! most a 32nd of larger ones), not page by page, which made the first pass 1.26 times slower
//! on the GPU (`BENCHMARKS.md`, "Views of whole mappings"). The buffer uses the start of the
//! view's last mapping only as far as it needs: the rest of that mapping stays free in the
//! range, for anyone.
//!
//! Why it settles: a view is kept when its block is freed, its memory returned to the range's
//! holes. A later request of the same `need` first looks for a kept view of it whose memory is
//! all free again and takes it with no backend call. A pass that repeats the last one's
//! requests from the same layout (the last grew nothing) finds at each request the holes it
//! found before and the view made for it then, so it maps nothing. A pass may start from
//! another layout than the last (the block freed last at its end goes to the next pass's first
//! request of its size where it lies): then a view may be made again, until each layout the
//! loop comes back to has its own (`BENCHMARKS.md`, "Views of the range's free pages").
//!
//! The books: while a view's block is in use, each run of the range's memory it uses is a
//! block of the range in state [`BlockState::Aliased`], neither free nor allocated, so that
//! the range hands none of it out; the view's block is allocated, counted as any other, but
//! lies in no segment's list. A view reserves nothing: reserved bytes are the range's mapped
//! memory, which the view only names a second time. Snapshots list a view in use as a segment
//! of its own, at the buffer's address, and leave the memory it uses out of the range's
//! segment, so that the segments still sum to the memory held. A view is given back
//! (unaliased) before any of its mappings is unmapped or its range released, and when the cache
//! is emptied. It is tried before [`Heap::grow`] ([`Heap::try_view`]): it reuses cached memory,
//! so it neither advances the clock of idle streams nor counts as a regrowth for the limit.

use super::accounting::Note;
use super::{Block, BlockState, Heap};
use crate::alloc::ids::{BlockId, SegmentId, StreamId};
use crate::alloc::stats::Pool;
use crate::backend::Backend;

/// A range of addresses: start and length.
type Span = (u64, u64);

/// A free block of a range: address, size and the block.
pub(super) type FreeBlock = (u64, u64, BlockId);

/// The block of `blocks` (ascending) that starts at or before `addr`, the last such.
fn holder(blocks: &[FreeBlock], addr: u64) -> Option<FreeBlock> {
    let i = blocks.partition_point(|&(a, _, _)| a <= addr);
    i.checked_sub(1).map(|i| blocks[i])
}

/// The views of ranges' free pages ([`View`]), in use and idle, with what making them needs.
/// Its fields are private to this file: views are made, held and given back here.
#[derive(Debug, Default)]
pub(super) struct Views {
    /// Whether large requests may be served through views of the range's free pages
    /// (`alias_pages`, on a backend that can alias).
    enabled: bool,
    /// The views made so far, in use and idle.
    list: Vec<View>,
    /// A buffer for the free blocks of a range that a view is looked for in.
    free_blocks: Vec<FreeBlock>,
}

impl Views {
    pub(super) fn new(enabled: bool) -> Self {
        Views { enabled, ..Views::default() }
    }

    /// Whether any view exists.
    #[inline]
    pub(super) fn any(&self) -> bool {
        !self.list.is_empty()
    }

    /// Every view, in use and idle.
    #[cfg(test)]
    pub(super) fn all(&self) -> &[View] {
        &self.list
    }
}

/// Mappings of the range mapped once more at addresses of their own.
#[derive(Debug)]
pub(crate) struct View {
    /// Where the view starts.
    pub(crate) addr: u64,
    /// The range's memory the view's block uses, as runs (address, length) in the view's
    /// order, ascending: whole mappings of the range, but for the last run, which may end
    /// inside its last mapping (the rest of that mapping stays the range's, and the view's
    /// block never touches it).
    pub(crate) runs: Box<[Span]>,
    /// The runs' sum: the size of the requests the view serves, in whole pages.
    pub(crate) len: u64,
    /// The view's length: its mappings', whole (at least `len`).
    pub(crate) span: u64,
    /// The range they lie in.
    pub(crate) range: SegmentId,
    /// The view's block: allocated (or waiting for other streams) while `held` is not empty.
    pub(crate) block: BlockId,
    /// The range's blocks that hold the runs while the view's block is in use, one per run in
    /// the order of `runs`; empty while the view is idle.
    pub(crate) held: Vec<BlockId>,
}

impl View {
    /// Whether the view maps memory of `[addr, end)` of its range: its runs, the last one to
    /// the end of its mapping.
    fn maps_any_of(&self, addr: u64, end: u64) -> bool {
        let last = self.runs.len() - 1;
        self.runs.iter().enumerate().any(|(k, &(p, l))| {
            let l = if k == last { l + self.span - self.len } else { l };
            p < end && p + l > addr
        })
    }
}

impl Heap {
    /// Where a request of `size` bytes on `stream` finds no cached block (nor another stream's
    /// range to borrow from), and its stream's range would grow: a view of the range's free
    /// mappings if one needs fewer new bytes than the growth ([`Heap::serve_by_view`]). Tried
    /// before [`Heap::grow`]: a view reuses cached memory, so it counts neither as a request
    /// that found none (the clock of idle streams) nor as a regrowth.
    pub(super) fn try_view(
        &mut self,
        backend: &dyn Backend,
        pool: Pool,
        stream: StreamId,
        size: u64,
    ) -> Option<BlockId> {
        if !self.views.enabled || size <= super::SMALL_SIZE || !self.may_grow_in_place(pool, stream) {
            return None;
        }
        // A view may take any of the range's free mappings, loans given back unasked among
        // them: every other stream's are asked about first (`Heap::find_checked` asks only
        // about those in the block it takes).
        self.check_others(backend, stream);
        self.settle();
        let g = self.growth_plan(stream, size)?;
        self.serve_by_view(backend, stream, size, g.seg, g.by)
    }

    /// Serves a request of `size` bytes on `stream` through a view of range `range`'s free
    /// mappings, where growing the range would map `lacks` bytes and a view needs fewer new
    /// ones: a kept view whose runs are all free again, else a new one (after growing the range
    /// by what its wholly free mappings lack). `None`: growing is the better way, or a backend
    /// call failed (the caller then grows as without views; nothing changed here but a growth
    /// kept).
    pub(super) fn serve_by_view(
        &mut self,
        backend: &dyn Backend,
        stream: StreamId,
        size: u64,
        range: SegmentId,
        lacks: u64,
    ) -> Option<BlockId> {
        // The range's free blocks go in a buffer kept between requests (views are tried on
        // every request that no hole fits; in a settled loop each finds a kept view).
        let mut blocks = std::mem::take(&mut self.views.free_blocks);
        let served = self.serve_by_view_with(backend, stream, size, range, lacks, &mut blocks);
        self.views.free_blocks = blocks;
        served
    }

    /// [`Heap::serve_by_view`]'s work, with `blocks` to list the range's free blocks in.
    fn serve_by_view_with(
        &mut self,
        backend: &dyn Backend,
        stream: StreamId,
        size: u64,
        range: SegmentId,
        lacks: u64,
        blocks: &mut Vec<FreeBlock>,
    ) -> Option<BlockId> {
        let need = size.next_multiple_of(self.setup.page);
        self.list_free_blocks(range, blocks);
        // Whether `[addr, addr + len)` lies in one free block.
        let is_free = |&(addr, len): &(u64, u64)| holder(blocks, addr).is_some_and(|(a, s, _)| a + s >= addr + len);
        let idle = self
            .views
            .list
            .iter()
            .position(|v| v.range == range && v.held.is_empty() && v.len == need && v.runs.iter().all(is_free));
        if let Some(v) = idle {
            self.hold(v, size, stream, blocks);
            return Some(self.views.list[v].block);
        }
        let mut free = self.mapped_runs(range, blocks);
        let have: u64 = free.iter().map(|&(_, l)| l).sum();
        if need.saturating_sub(have) >= lacks {
            return None;
        }
        if have < need {
            let growth = super::expand::Growth { seg: range, by: need - have };
            if let Err(e) = self.grow_in_place(backend, growth) {
                self.accounting.keep_error(format!("growing the range for a view: {e}"));
                return None;
            }
            self.list_free_blocks(range, blocks);
            free = self.mapped_runs(range, blocks);
        }
        // The first wholly free mappings, in address order, until they hold `need` bytes.
        let seg = &self.segments[range];
        let (mut maps, mut runs, mut span, mut left) = (Vec::new(), Vec::<Span>::new(), 0, need);
        'runs: for &(addr, len) in &free {
            for g in seg.granules_inside(addr, len) {
                let (at, l) = seg.granule_span(g, g + 1);
                maps.push(at);
                span += l;
                let take = l.min(left);
                match runs.last_mut() {
                    Some((a, k)) if *a + *k == at => *k += take,
                    _ => runs.push((at, take)),
                }
                left -= take;
                if left == 0 {
                    break 'runs;
                }
            }
        }
        debug_assert_eq!(left, 0, "the range holds the free mappings counted above");
        let addr = match backend.alias(&maps) {
            Ok(addr) => addr,
            Err(e) => {
                self.note(Note::BackendError);
                self.accounting.keep_error(format!("a view of {} mappings ({need} bytes): {e}", maps.len()));
                return None;
            }
        };
        self.note(Note::View { mapped: true });
        let mut b = Block::fresh(addr, size, range, Pool::Large, stream, None);
        b.view = true;
        let block = self.new_block(b);
        self.views.list.push(View { addr, runs: runs.into(), len: need, span, range, block, held: Vec::new() });
        self.hold(self.views.list.len() - 1, size, stream, blocks);
        Some(block)
    }

    /// Lists range `range`'s free blocks (address, size, block) into `out`, ascending: one walk
    /// over the range's blocks.
    fn list_free_blocks(&self, range: SegmentId, out: &mut Vec<FreeBlock>) {
        out.clear();
        let mut next = self.segments[range].head;
        while let Some(i) = next {
            let b = &self.blocks[i];
            next = b.next;
            if b.state == BlockState::Free {
                out.push((b.addr, b.size, i));
            }
        }
    }

    /// The runs of range `range`'s wholly free, mapped mappings (address, length), ascending,
    /// from its free blocks ([`Heap::list_free_blocks`]): one run per free block where the
    /// range is wholly mapped (a loop's steady state), so that this costs a look at each free
    /// block, not at each mapping.
    fn mapped_runs(&self, range: SegmentId, blocks: &[FreeBlock]) -> Vec<Span> {
        let seg = &self.segments[range];
        let mut runs = Vec::new();
        for &(addr, size, i) in blocks {
            let inside = seg.granules_inside(addr, size);
            if inside.is_empty() {
                continue;
            }
            if seg.wholly_mapped() || !self.blocks[i].unmapped {
                runs.push(seg.granule_span(inside.start, inside.end));
            } else {
                let mapped = self.page_runs(range, inside.start, inside.end, false);
                runs.extend(mapped.into_iter().map(|(first, end)| seg.granule_span(first, end)));
            }
        }
        runs
    }

    /// Takes idle view `v`'s runs (all free) out of its range's free blocks and hands its
    /// block out for a request of `size` bytes on `stream`. `blocks`: the range's free blocks
    /// as they are now ([`Heap::list_free_blocks`]), where each run's block is looked up.
    fn hold(&mut self, v: usize, size: u64, stream: StreamId, blocks: &[FreeBlock]) {
        let mut held = Vec::with_capacity(self.views.list[v].runs.len());
        for k in 0..self.views.list[v].runs.len() {
            let (addr, len) = self.views.list[v].runs[k];
            // The free block that held the run before this view took any: the run's block
            // itself, or, where an earlier run of this view was carved from it, a block
            // after that one (carving keeps the run's part under the block's own name).
            let (_, _, mut i) = holder(blocks, addr).expect("a view's runs lie in its range's free blocks");
            while self.blocks[i].addr + self.blocks[i].size <= addr {
                i = self.blocks[i].next.expect("a view's runs lie in its range");
            }
            debug_assert_eq!(self.blocks[i].state, BlockState::Free);
            held.push(self.carve(i, addr, len));
        }
        let view = &mut self.views.list[v];
        view.held = held;
        let b = &mut self.blocks[view.block];
        b.size = size;
        b.stream = stream;
        b.state = BlockState::Allocated;
    }

    /// Cuts `[p, p + len)` out of free block `i` (which holds it whole): the blocks before and
    /// after it stay free, the run becomes a block of its own in state `Aliased`.
    fn carve(&mut self, i: BlockId, p: u64, len: u64) -> BlockId {
        self.unindex_free(i);
        let (addr, size) = (self.blocks[i].addr, self.blocks[i].size);
        let unmapped = self.blocks[i].unmapped;
        if p > addr {
            let b = &self.blocks[i];
            let mut before = Block::fresh(addr, p - addr, b.segment, b.pool, b.stream, b.prev);
            before.next = Some(i);
            before.unmapped = unmapped;
            let a = self.new_block(before);
            match self.blocks[a].prev {
                None => {
                    let seg = self.blocks[a].segment;
                    self.segments[seg].head = Some(a);
                }
                Some(prev) => self.blocks[prev].next = Some(a),
            }
            self.blocks[i].prev = Some(a);
            self.blocks[i].addr = p;
            self.blocks[i].size -= p - addr;
            self.index_free(a);
        }
        if addr + size > p + len {
            let b = &self.blocks[i];
            let mut after = Block::fresh(p + len, addr + size - (p + len), b.segment, b.pool, b.stream, Some(i));
            after.next = b.next;
            after.unmapped = unmapped;
            let c = self.new_block(after);
            match self.blocks[c].next {
                Some(next) => self.blocks[next].prev = Some(c),
                None => {
                    let seg = self.blocks[c].segment;
                    self.segments[seg].tail = Some(c);
                }
            }
            self.blocks[i].next = Some(c);
            self.blocks[i].size = len;
            self.index_free(c);
        }
        let b = &mut self.blocks[i];
        b.state = BlockState::Aliased;
        b.unmapped = false;
        i
    }

    /// View block `i` is no longer used by any stream: its runs go back to the range's free
    /// blocks, and the view is kept, idle, for the next request of its length.
    pub(super) fn let_view_go(&mut self, i: BlockId) {
        let v = self.views.list.iter().position(|v| v.block == i).expect("a view block has its view");
        for h in std::mem::take(&mut self.views.list[v].held) {
            self.blocks[h].state = BlockState::Free;
            self.merge_free(h);
        }
        let b = &mut self.blocks[i];
        b.state = BlockState::Free;
        b.requested = 0;
    }

    /// Gives back the idle views of range `range` (every range's with `None`) that map memory
    /// of `[addr, end)`; false if the backend refused one (it stays, and so must its mappings).
    pub(super) fn drop_views(&mut self, backend: &dyn Backend, range: Option<SegmentId>, addr: u64, end: u64) -> bool {
        let mut ok = true;
        let mut v = 0;
        while v < self.views.list.len() {
            let view = &self.views.list[v];
            let hit = view.held.is_empty() && range.is_none_or(|r| r == view.range) && view.maps_any_of(addr, end);
            if !hit {
                v += 1;
                continue;
            }
            // SAFETY: the view is idle (its block free, its runs back in the range), so nothing
            // on the host uses its memory; other streams' work was waited for before the free
            // completed.
            if !unsafe { self.unalias_view(backend, v) } {
                ok = false;
                v += 1;
                continue;
            }
            let view = self.views.list.swap_remove(v);
            self.drop_block(view.block);
            self.note(Note::View { mapped: false });
        }
        ok
    }

    /// Unmaps every view and forgets them all, at the allocator's end
    /// ([`Heap::release_everything`]).
    ///
    /// # Safety
    ///
    /// No buffer exists: nothing on the host uses any view (every view is idle or held by a
    /// block kept out of use).
    pub(super) unsafe fn give_back_views(&mut self, backend: &dyn Backend) {
        for v in 0..self.views.list.len() {
            // SAFETY: no buffer exists (this function's contract), so nothing on the host uses
            // the view; work queued on its block's stream is the backend's to order the unmap
            // after. A view held by a block kept out of use (its streams could be neither waited
            // for nor synchronized) is given back as that block's segment is: on the same
            // promise, which those streams' failure already broke.
            unsafe { self.unalias_view(backend, v) };
        }
        self.views.list.clear();
    }

    /// Unmaps view `v` (it stays listed); false, the error kept, if the backend refused.
    ///
    /// # Safety
    ///
    /// Nothing on the host uses the view's memory, and no work queued on a stream other than
    /// its block's (which the backend orders the unmap after) does.
    pub(super) unsafe fn unalias_view(&mut self, backend: &dyn Backend, v: usize) -> bool {
        let view = &self.views.list[v];
        let (at, span) = (view.addr, view.span);
        let raw = self.streams[self.blocks[view.block].stream.index()].raw;
        // SAFETY: the caller's promise, passed on; `at` and `span` are a view this heap made.
        if let Err(e) = unsafe { backend.unalias(at, span, raw) } {
            self.note(Note::BackendError);
            self.accounting.keep_error(format!("unmapping the view at {at:#x}: {e}"));
            return false;
        }
        true
    }

    /// Whether aliased block `i` of a range is held by a view in use.
    pub(crate) fn held_by_a_view(&self, i: BlockId) -> bool {
        self.views.list.iter().any(|v| v.held.contains(&i))
    }

    /// The views whose blocks are in use: each view's block, the range's blocks holding its
    /// runs, and the bytes they hold (for the snapshots and the invariant checks).
    pub(crate) fn views_in_use(&self) -> impl Iterator<Item = (BlockId, &[BlockId], u64)> + '_ {
        self.views.list.iter().filter(|v| !v.held.is_empty()).map(|v| (v.block, v.held.as_slice(), v.len))
    }
}

#[cfg(test)]
mod tests {
    use super::super::check_heap;
    use super::super::tests::heap;
    use crate::alloc::ids::StreamId;

    const MIB: u64 = 1 << 20;

    #[test]
    fn scattered_free_pages_serve_a_request_through_a_view_kept_for_the_next_pass() {
        let (mut h, sim) = heap("alias_pages:True");
        let s = StreamId(0);
        // Four 4 MiB blocks: the range grows by each, no free end.
        let blocks: Vec<_> = (0..4).map(|_| h.alloc(&sim, s, 4 * MIB, None).unwrap()).collect();
        assert_eq!((h.largest_free(), h.reserved()), (0, 16 * MIB));
        h.free(&sim, blocks[0].block, None);
        h.free(&sim, blocks[2].block, None);
        h.settle();
        let (reserved, calls) = (h.reserved(), h.accounting.stats().num_device_map);
        // 8 MiB: no hole fits, growing would map 4 pages; the holes' 4 pages map none.
        let v = h.alloc(&sim, s, 8 * MIB, None).unwrap();
        assert!(v.lent, "a view's block is freed through the heap");
        assert_eq!(h.reserved(), reserved, "a view reserves nothing");
        assert_eq!((h.accounting.stats().num_device_map, sim.views()), (calls + 1, 1), "one view mapped");
        let range = h.segments[h.blocks[blocks[1].block].segment].clone();
        assert!(v.addr >= range.addr + range.size || v.addr + 8 * MIB <= range.addr, "at addresses of its own");
        assert_eq!((h.views.list[0].len, h.views.list[0].span), (8 * MIB, 8 * MIB));
        assert_eq!(
            &*h.views.list[0].runs,
            &[(blocks[0].addr, 4 * MIB), (blocks[2].addr, 4 * MIB)],
            "the first hole first"
        );
        check_heap(&h).unwrap();
        // The holes are held: a request that would fit one grows the range instead.
        let other = h.alloc(&sim, s, 4 * MIB, None).unwrap();
        assert!(other.addr >= range.addr + range.size - 2 * MIB, "not in a held hole: {:#x}", other.addr);
        h.free(&sim, other.block, None);
        // Freed, the view's pages go back to the range; the next pass takes the same view.
        h.free(&sim, v.block, None);
        h.settle();
        check_heap(&h).unwrap();
        let calls = h.accounting.stats().num_device_map;
        let again = h.alloc(&sim, s, 7 * MIB, None).unwrap();
        assert_eq!(
            (again.addr, h.accounting.stats().num_device_map),
            (v.addr, calls),
            "the kept view, no backend call"
        );
        h.free(&sim, again.block, None);
        // Emptying the cache gives the idle view back.
        h.settle();
        h.release_cache(&sim, true);
        assert_eq!((sim.views(), h.views.list.len()), (0, 0));
        check_heap(&h).unwrap();
    }

    #[test]
    fn a_view_maps_whole_mappings_and_leaves_the_rest_of_its_last_one_to_the_range() {
        let (mut h, sim) = heap("alias_pages:True");
        let s = StreamId(0);
        // A range reserved for 512 MiB maps it in 16 MiB granules, one mapping each.
        let first = h.alloc(&sim, s, 512 * MIB, None).unwrap();
        let range = h.blocks[first.block].segment;
        assert_eq!(h.segments[range].granule, 16 * MIB);
        h.free(&sim, first.block, None);
        h.settle();
        let p = h.alloc(&sim, s, 100 * MIB, None).unwrap();
        let q = h.alloc(&sim, s, 200 * MIB, None).unwrap();
        let r = h.alloc(&sim, s, 200 * MIB, None).unwrap();
        let base = p.addr;
        assert_eq!((q.addr, r.addr), (base + 100 * MIB, base + 300 * MIB));
        h.free(&sim, p.block, None);
        h.free(&sim, r.block, None);
        h.settle();
        // Holes of 100 and 212 MiB; 250 MiB fits neither. Their wholly free mappings hold 96
        // and 208 MiB: the view takes the first six, then ten from 304 MiB on, the last only
        // for its first 10 MiB.
        let calls = h.accounting.stats().num_device_map;
        let v = h.alloc(&sim, s, 250 * MIB, None).unwrap();
        assert_eq!((h.reserved(), h.accounting.stats().num_device_map, sim.views()), (512 * MIB, calls + 1, 1));
        let view = &h.views.list[0];
        assert_eq!((view.len, view.span), (250 * MIB, 256 * MIB));
        assert_eq!(&*view.runs, &[(base, 96 * MIB), (base + 304 * MIB, 154 * MIB)]);
        check_heap(&h).unwrap();
        // The rest of that mapping is the range's: 50 MiB goes there, beside the view's run.
        let rest = h.alloc(&sim, s, 50 * MIB, None).unwrap();
        assert_eq!(rest.addr, base + 458 * MIB);
        check_heap(&h).unwrap();
        // Unmapping a mapping a view maps is refused by the backend: the range gives back its
        // idle views first, so emptying the cache leaves nothing mapped twice.
        for b in [v.block, rest.block, q.block] {
            h.free(&sim, b, None);
        }
        h.settle();
        h.release_cache(&sim, true);
        assert_eq!((sim.views(), h.views.list.len(), h.reserved()), (0, 0, 0));
        check_heap(&h).unwrap();
    }

    #[test]
    fn a_view_is_made_only_where_it_maps_fewer_new_pages_than_growing() {
        let (mut h, sim) = heap("alias_pages:True");
        let s = StreamId(0);
        let a = h.alloc(&sim, s, 4 * MIB, None).unwrap();
        let _b = h.alloc(&sim, s, 4 * MIB, None).unwrap();
        // No free page: a view would map as many new pages as growing does. The range grows.
        let c = h.alloc(&sim, s, 8 * MIB, None).unwrap();
        assert_eq!((sim.views(), h.reserved()), (0, 16 * MIB));
        assert!(!c.lent);
        // Two free pages: 8 MiB through a view maps two new pages, growing four.
        h.free(&sim, a.block, None);
        h.free(&sim, c.block, None);
        h.settle();
        // The free end (8 MiB) fits 8 MiB: no growth, no view.
        let d = h.alloc(&sim, s, 8 * MIB, None).unwrap();
        assert_eq!((sim.views(), h.reserved()), (0, 16 * MIB));
        // 12 MiB: no hole fits, growing maps 6 pages, the 2 free pages leave a view 4 to map.
        let e = h.alloc(&sim, s, 12 * MIB, None).unwrap();
        assert_eq!((sim.views(), h.reserved()), (1, 24 * MIB));
        assert!(e.lent);
        // Small requests never take a view.
        h.free(&sim, d.block, None);
        h.settle();
        let small = h.alloc(&sim, s, MIB, None).unwrap();
        assert_eq!(sim.views(), 1);
        h.free(&sim, small.block, None);
        h.free(&sim, e.block, None);
        h.settle();
        check_heap(&h).unwrap();
    }
}
