//! Growing segments in place, as PyTorch's expandable segments do: on a backend that maps
//! pages, a large segment is reserved with room for addresses after it, and a request that no
//! free block fits maps more memory at the end of the segment whose free end is largest, so
//! that the new block is that free end plus only what it lacks.
//!
//! Why it lowers the peak: with segments that cannot grow, a request larger than every free
//! block reserves a whole new segment while the free ends of the others stay reserved; and
//! memory freed in one segment never merges with its neighbour in the next. Growing, the free
//! end is used and the segments of a stream's working set become one, whose holes merge
//! whatever size the next step's tensors are (dynamic shapes, growing caches).
//!
//! One range grows at a time: a stream may grow (or reserve a segment that may) while no other
//! stream holds a segment reserved to grow ([`Heap::may_grow_in_place`]). Other streams'
//! segments are reserved without room, and memory moves to them as lent blocks and idle
//! streams' whole segments (`streams.rs`, `pages.rs`): every stream growing its own range
//! stranded memory in one stream's range that another needed (a two-stream pipeline needed
//! 1.25x its peak of allocated bytes that way, 1.14x with nothing growing: `BENCHMARKS.md`).
//! Stopping the one range as soon as another stream held any large segment cost more still on
//! traces where a side stream holds a little (`BENCHMARKS.md`, "One range grows beside other
//! streams").

use super::accounting::Note;
use super::{Block, BlockState, Heap};
use crate::alloc::ids::{BlockId, SegmentId, StreamId};
use crate::alloc::stats::Pool;
use crate::backend::{granule_pieces, Backend};
use crate::error::BackendError;

/// A segment to grow and by how much.
#[derive(Debug, Clone, Copy)]
pub(super) struct Growth {
    pub(super) seg: SegmentId,
    /// Bytes to map at its end (whole pages).
    pub(super) by: u64,
}

impl Heap {
    /// Whether a request of `pool` on `stream` may grow a segment in place (or reserve one that
    /// may): the backend maps pages, the request is large, and no other stream holds a segment
    /// reserved to grow. One range grows at a time; other streams' segments are reserved
    /// without room, and do not stop it.
    ///
    /// Why not "while no other stream holds a large segment", as before: a side stream's first
    /// large request (an EMA update, a bucket of gradients, a prefetched batch) then stopped the
    /// main stream's range from growing for as long as the side stream held a segment, and the
    /// main stream reserved a segment per size again, beside free ends that stayed reserved.
    /// Replayed as on CUDA, 480 traces of random shapes on two to four streams made 31% fewer
    /// warm driver calls (2,435 to 1,681), 28 rows called after the second warm pass instead of
    /// 52, and the geometric mean of the peaks fell on each set of 120, by 0.8% to 2.3%;
    /// `prefetch_side_stream` reserves 1.049 times its peak instead of 1.108 (`BENCHMARKS.md`,
    /// "One range grows beside other streams").
    pub(super) fn may_grow_in_place(&self, pool: Pool, stream: StreamId) -> bool {
        self.setup.can_unmap && pool == Pool::Large && self.streams[stream.index()].growable == self.streams.growable()
    }

    /// Reserves a segment of `size` bytes, with room to grow where [`Heap::may_grow_in_place`]
    /// holds (as many addresses as the device has memory, as PyTorch's expandable segments
    /// reserve; where the backend refuses them other than for lack of memory, a plain
    /// segment). Returns its address and room. One request for memory either way: a refusal for
    /// lack of memory is the caller's to handle (it releases the cache and retries).
    pub(super) fn reserve_segment(
        &mut self,
        backend: &dyn Backend,
        pool: Pool,
        stream: StreamId,
        size: u64,
    ) -> Result<(u64, u64), BackendError> {
        self.within_cap(size)?;
        if self.may_grow_in_place(pool, stream) {
            let span = backend.total_memory().next_multiple_of(self.setup.page).max(size);
            match backend.reserve_growable(size, span) {
                Ok(addr) => return Ok((addr, span - size)),
                Err(e @ BackendError::OutOfMemory { .. }) => return Err(e),
                Err(_) => {}
            }
        }
        backend.reserve(size).map(|addr| (addr, 0))
    }

    /// Whether free block `block` is *wilderness* for a request on `stream`: the free end of a
    /// segment that `stream` may grow in place now. Best fit takes it only where no other free
    /// block fits ([`Heap::find_free`]): the "wilderness preservation" that Korn and Vo named,
    /// and the way dlmalloc treats its top chunk (as larger than any other free chunk).
    ///
    /// Why: the free end is the one block that serves any request, growing by what it lacks;
    /// a hole serves only the requests that fit it. A request that a hole would fit but that
    /// takes the end because the end is smaller leaves the hole idle, and the next request
    /// larger than the hole grows the range by what the end no longer has: mapped memory
    /// nothing uses. This rule is about where a step's blocks lie in one range, not about any
    /// workload; on 120 single-stream traces of random shapes replayed as on CUDA that nobody
    /// had replayed before, it lowered the peak on 59 and raised it on 9, and the warm passes'
    /// driver calls fell from 163 to 68 (`BENCHMARKS.md`, "The free end last"). Where the
    /// segment may not grow (another stream's range grows), the free end is a block like any
    /// other, and best fit stands.
    #[inline]
    pub(super) fn is_wilderness(&self, block: BlockId, stream: StreamId) -> bool {
        let b = &self.blocks[block];
        b.next.is_none() && self.segments[b.segment].room > 0 && self.may_grow_in_place(b.pool, stream)
    }

    /// The segment of `stream` to grow for a request of `size` bytes: the one whose free end
    /// (its last block, if free) is largest, with room for what that end lacks.
    pub(super) fn growth_plan(&self, stream: StreamId, size: u64) -> Option<Growth> {
        let mut best: Option<(u64, Growth)> = None;
        for (s, seg) in self.segments.iter() {
            if !seg.live || seg.pool != Pool::Large || seg.stream != stream || seg.room == 0 {
                continue;
            }
            let tail = seg.tail.expect("a live segment has blocks");
            let end = if self.blocks[tail].state == BlockState::Free { self.blocks[tail].size } else { 0 };
            // A free end that fits was passed over by the split rules: growing would not help.
            if end >= size {
                continue;
            }
            let by = (size - end).next_multiple_of(self.setup.page);
            if by <= seg.room && best.is_none_or(|(e, _)| end > e) {
                best = Some((end, Growth { seg: s, by }));
            }
        }
        best.map(|(_, g)| g)
    }

    /// Maps `g.by` bytes at the end of segment `g.seg`, in granules of their own
    /// ([`granule_pieces`] of the growth), and returns the free block that now ends the
    /// segment (its former free end, grown). If the backend refuses, nothing changes (what was
    /// mapped is unmapped again) and its error is returned.
    pub(super) fn grow_in_place(&mut self, backend: &dyn Backend, g: Growth) -> Result<BlockId, BackendError> {
        let seg = &self.segments[g.seg];
        let (start, old_size, pool, stream) = (seg.addr + seg.size, seg.size, seg.pool, seg.stream);
        self.within_cap(g.by)?;
        let pieces: Vec<(u64, u64)> = granule_pieces(g.by, self.setup.page).collect();
        self.map_pieces(backend, start, &pieces, stream)?;
        // Counted as oversize from the size it grows to (as a segment reserved at that size
        // would be), so that its release, at that size or larger, takes back what was counted.
        if !self.is_oversize(old_size) && self.is_oversize(old_size + g.by) {
            self.note(Note::GrewOversize);
        }
        let seg = &mut self.segments[g.seg];
        for (offset, len) in pieces {
            seg.push_grown(old_size + offset, len);
        }
        seg.size += g.by;
        seg.room -= g.by;
        seg.mapped += g.by;
        let words = seg.granules().div_ceil(64) as usize;
        seg.unmapped_pages.resize(words, 0);
        self.note(Note::Pages { addr: start, len: g.by, pool, stream, mapped: true });
        let tail = self.segments[g.seg].tail.expect("a live segment has blocks");
        if self.blocks[tail].state == BlockState::Free {
            self.unindex_free(tail);
            self.blocks[tail].size += g.by;
            self.index_free(tail);
            return Ok(tail);
        }
        let b = self.new_block(Block::fresh(start, g.by, g.seg, self.blocks[tail].pool, stream, Some(tail)));
        self.blocks[tail].next = Some(b);
        self.segments[g.seg].tail = Some(b);
        self.index_free(b);
        Ok(b)
    }

    /// Maps each piece (offset from `start`, length) as one mapping; if the backend refuses
    /// one, unmaps what was mapped and returns its error.
    fn map_pieces(
        &mut self,
        backend: &dyn Backend,
        start: u64,
        pieces: &[(u64, u64)],
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let mut done = 0;
        for &(offset, len) in pieces {
            if let Err(e) = backend.map(start + offset, len) {
                if done > 0 {
                    let raw = self.streams[stream.index()].raw;
                    // SAFETY: `[start, start + done)` was mapped just above, whole mappings
                    // inside a segment's addresses, and nothing has used it yet.
                    if let Err(e) = unsafe { backend.unmap(start, done, raw) } {
                        self.note(Note::BackendError);
                        self.accounting.keep_error(format!("undoing a mapping at {start:#x}: {e}"));
                    }
                }
                return Err(e);
            }
            done = offset + len;
        }
        Ok(())
    }
}
