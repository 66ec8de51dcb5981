//! The block arena: blocks and segments in slot vectors, the free index over the free blocks,
//! and the walks over them that reports and the invariant checks use.

use super::accounting::Note;
use super::*;

impl Heap {
    #[inline]
    pub(super) fn new_block(&mut self, b: Block) -> BlockId {
        self.blocks.insert(b)
    }

    /// Block `i`'s [`Extra`], made where it has none (a spare one where there is: see
    /// `Heap::spare_extras`).
    #[inline]
    pub(super) fn extra_mut(&mut self, i: BlockId) -> &mut Extra {
        let spare = &mut self.spare_extras;
        self.blocks[i].extra.get_or_insert_with(|| spare.pop().unwrap_or_default())
    }

    /// Keeps an [`Extra`] a block no longer needs for the next one, emptied as new (its `uses`
    /// keeping their capacity), up to [`SPARE_EXTRAS`] of them.
    #[inline]
    pub(super) fn recycle_extra(&mut self, mut e: Box<Extra>) {
        if self.spare_extras.len() < SPARE_EXTRAS {
            let mut uses = std::mem::take(&mut e.uses);
            uses.clear();
            *e = Extra { uses, ..Extra::default() };
            self.spare_extras.push(e);
        }
    }

    /// A slot for a new segment (a released one's, or a new one).
    pub(super) fn new_segment(&mut self, seg: Segment) -> SegmentId {
        self.segments.insert(seg)
    }

    #[inline]
    pub(super) fn drop_block(&mut self, i: BlockId) {
        if let Some(e) = self.blocks[i].extra.take() {
            self.recycle_extra(e);
        }
        let b = &mut self.blocks[i];
        b.prev = None;
        b.next = None;
        self.blocks.release(i);
    }

    pub(super) fn pool_of_block(&self, i: BlockId) -> Pool {
        self.blocks[i].pool
    }

    pub(super) fn is_split(&self, i: BlockId) -> bool {
        let b = &self.blocks[i];
        b.prev.is_some() || b.next.is_some()
    }

    /// Counts free block `i` in the inactive-split statistics if it shares its segment.
    #[inline]
    pub(super) fn count_split(&mut self, i: BlockId) {
        if self.is_split(i) {
            let pool = self.pool_of_block(i);
            self.note(Note::SplitFree { size: self.blocks[i].size, pool, counted: true });
        }
    }

    /// Undoes [`count_split`](Self::count_split) before the block changes.
    #[inline]
    pub(super) fn uncount_split(&mut self, i: BlockId) {
        if self.is_split(i) {
            let pool = self.pool_of_block(i);
            self.note(Note::SplitFree { size: self.blocks[i].size, pool, counted: false });
        }
    }

    /// What the free index lists free block `i` under: a whole segment, and whether unmapping
    /// could give back any of its pages (constant time for blocks smaller than a page).
    #[inline]
    pub(super) fn free_flags(&self, i: BlockId) -> Flags {
        let b = &self.blocks[i];
        let whole = b.prev.is_none() && b.next.is_none();
        // The shortest granule is a page.
        if !self.setup.can_unmap || b.size < self.setup.page {
            return Flags { whole, mapped_pages: false };
        }
        let seg = &self.segments[b.segment];
        let mut inside = seg.granules_inside(b.addr, b.size);
        if seg.wholly_mapped() {
            return Flags { whole, mapped_pages: !inside.is_empty() };
        }
        // Usually the first granule answers: holes are unmapped whole or not at all.
        Flags { whole, mapped_pages: inside.any(|p| !Self::is_page_unmapped(seg, p)) }
    }

    /// Recomputes the free index's flags of indexed block `i` after its pages changed.
    pub(super) fn reflag(&mut self, i: BlockId) {
        let flags = self.free_flags(i);
        self.free.set_flags(i, flags);
    }

    /// Where block `i` stands among free blocks of its size: its segment's place in
    /// reservation order, then its offset in the segment. Best fit takes the lowest of equal
    /// sizes above 1 MiB (up to it the index's classes are exact and hand out the block of that
    /// size freed last: `FreeIndex::find`), and reclaim releases in this order among equals:
    /// decisions then never depend on the addresses the backend chose. `cuMemAlloc` reuses
    /// freed addresses where the sim hands out new ones, and ties broken by address made the
    /// same trace's peak differ between the two by up to 5% (`BENCHMARKS.md`, "Six workloads
    /// nobody had seen").
    pub(super) fn order_key(&self, i: BlockId) -> u64 {
        let b = &self.blocks[i];
        let seg = &self.segments[b.segment];
        seg.order | ((b.addr - seg.addr) & ((1 << super::ORDER_SHIFT) - 1))
    }

    /// Puts a free block in the index and counts it.
    pub(super) fn index_free(&mut self, i: BlockId) {
        let pool = self.pool_of_block(i);
        let b = &mut self.blocks[i];
        b.state = BlockState::Free;
        let (stream, size) = (b.stream, b.size);
        let flags = self.free_flags(i);
        let key = self.order_key(i);
        self.free.insert(i, pool as usize, stream.0, size, key, flags);
        self.count_split(i);
    }

    /// Takes a free block out of the index and uncounts it; it is no longer `Free` (so that
    /// no merge can reach it) until it is indexed again.
    pub(super) fn unindex_free(&mut self, i: BlockId) {
        self.blocks[i].state = BlockState::Allocated;
        let removed = self.free.remove(i);
        debug_assert!(removed, "{i:?} was not in the free index");
        self.uncount_split(i);
    }

    /// The largest free block (for reports), the block kept aside by the last free counted
    /// as merged (see [`Heap::hot_merge`]).
    pub(crate) fn largest_free(&self) -> u64 {
        let indexed = self.free.iter().map(|(_, size)| size).max().unwrap_or(0);
        indexed.max(self.hot_merge().map_or(0, |m| m.size))
    }

    /// Block `i`.
    pub(crate) fn block(&self, i: BlockId) -> &Block {
        &self.blocks[i]
    }

    /// Calls `f` with every block of every live segment, in address order per segment.
    pub(crate) fn for_each_block(&self, mut f: impl FnMut(BlockId, &Segment, &Block)) {
        for (_, seg) in self.segments.iter().filter(|(_, s)| s.live) {
            let mut next = seg.head;
            while let Some(i) = next {
                let b = &self.blocks[i];
                f(i, seg, b);
                next = b.next;
            }
        }
    }

    /// Whether free block `i` is in the free index and there listed as a whole segment, and
    /// how many blocks, and whole segments, the index holds (for the invariant checks: the
    /// lookups are linear).
    pub(crate) fn free_index_state(&self, i: Option<BlockId>) -> (bool, bool, usize, usize) {
        let (indexed, whole) = i.map_or((false, false), |i| (self.free.contains(i), self.free.whole().contains(&i)));
        (indexed, whole, self.free.len(), self.free.whole().len())
    }

    /// Whether the allocator unmaps the pages under free blocks.
    pub(crate) fn can_unmap(&self) -> bool {
        self.setup.can_unmap
    }

    /// Whether free block `i` is on the free index's list of blocks with mapped whole pages.
    pub(crate) fn listed_with_mapped_pages(&self, i: BlockId) -> bool {
        self.free.with_mapped_pages().contains(&i)
    }

    /// The unmapped ranges of live segment `seg`, as `(address, length)`, in address order,
    /// adjacent granules joined.
    pub(crate) fn unmapped_ranges(seg: &Segment) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        if seg.wholly_mapped() {
            return ranges;
        }
        for g in 0..seg.granules() {
            if !Self::is_page_unmapped(seg, g) {
                continue;
            }
            let (addr, len) = seg.granule_span(g, g + 1);
            match ranges.last_mut() {
                Some((a, l)) if *a + *l == addr => *l += len,
                _ => ranges.push((addr, len)),
            }
        }
        ranges
    }

    /// Whether granule `p` of live segment `seg` is unmapped.
    pub(crate) fn is_page_unmapped(seg: &Segment, p: u64) -> bool {
        seg.unmapped_pages[(p / 64) as usize] & (1 << (p % 64)) != 0
    }
}

impl Segment {
    /// How many uniform granules the segment was reserved with (the last may be shorter).
    fn uniform_granules(&self) -> u64 {
        // The granule is a power of two: a shift, not a division.
        (self.uniform_end + self.granule - 1) >> self.granule.trailing_zeros()
    }

    /// Adds a granule of `len` bytes (whole pages) at offset `off`, the segment's end, as a
    /// growth maps it; the caller then adds `len` to the size.
    pub(crate) fn push_grown(&mut self, off: u64, len: u64) {
        let index = u32::try_from(self.grown.len()).expect("fewer than 2^32 granules");
        self.grown.push(off);
        self.grown_at_page.extend(std::iter::repeat_n(index, (len >> self.page_shift) as usize));
    }

    /// The index in `grown` of the granule holding offset `off`, at or after `uniform_end`
    /// and below the size.
    fn grown_at(&self, off: u64) -> usize {
        self.grown_at_page[((off - self.uniform_end) >> self.page_shift) as usize] as usize
    }

    /// Whether every granule is mapped (a loop's steady state): no page bitmap to read then.
    #[inline]
    pub(crate) fn wholly_mapped(&self) -> bool {
        self.mapped == self.size
    }

    /// How many granules the segment has: the uniform ones, then those it grew by.
    pub(crate) fn granules(&self) -> u64 {
        self.uniform_granules() + self.grown.len() as u64
    }

    /// The offset where granule `i` starts (`granules()`: the segment's end).
    fn granule_offset(&self, i: u64) -> u64 {
        let u = self.uniform_granules();
        if i <= u {
            (i * self.granule).min(self.uniform_end)
        } else {
            self.grown.get((i - u) as usize).copied().unwrap_or(self.size)
        }
    }

    /// The granule holding offset `off` (below the size).
    fn granule_at(&self, off: u64) -> u64 {
        if off < self.uniform_end {
            off >> self.granule.trailing_zeros()
        } else {
            self.uniform_granules() + self.grown_at(off) as u64
        }
    }

    /// The address and length of granules `[start, stop)`.
    pub(crate) fn granule_span(&self, start: u64, stop: u64) -> (u64, u64) {
        let (from, to) = (self.granule_offset(start), self.granule_offset(stop));
        (self.addr + from, to - from)
    }

    /// The granules lying wholly inside `[addr, addr + len)`, a range of the segment. Uniform
    /// granules are a power of two: shifts, not divisions (this runs on every merge); those a
    /// segment grew by are looked up in a table by page (`grown_at_page`).
    pub(crate) fn granules_inside(&self, addr: u64, len: u64) -> std::ops::Range<u64> {
        let (shift, mask) = (self.granule.trailing_zeros(), self.granule - 1);
        let (off, end_off) = (addr - self.addr, addr + len - self.addr);
        let u = self.uniform_granules();
        let first = if off < self.uniform_end {
            ((off + mask) >> shift).min(u)
        } else {
            // The granule holding `off`, or the next if `off` is inside it.
            let g = self.grown_at(off);
            u + g as u64 + u64::from(self.grown[g] < off)
        };
        let end = if end_off >= self.size {
            self.granules()
        } else if end_off < self.uniform_end {
            end_off >> shift
        } else {
            // The granules before the one holding `end_off` end at or before it.
            u + self.grown_at(end_off) as u64
        };
        first..end.max(first)
    }

    /// The granules that `[addr, addr + len)`, a range of the segment, touches.
    pub(crate) fn granules_touching(&self, addr: u64, len: u64) -> std::ops::Range<u64> {
        let off = addr - self.addr;
        self.granule_at(off)..self.granule_at(off + len - 1) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Pool, Segment, StreamId};
    use crate::backend::granule_pieces;

    /// A segment reserved with `size` bytes in granules of `granule`, grown by each of `growths`
    /// as `grow_in_place` grows one.
    fn grown_segment(size: u64, granule: u64, growths: &[u64], page: u64) -> Segment {
        let mut seg = Segment {
            addr: 1 << 40,
            size,
            order: 0,
            pool: Pool::Large,
            stream: StreamId(0),
            head: None,
            tail: None,
            granule,
            uniform_end: size,
            grown: Vec::new(),
            grown_at_page: Vec::new(),
            page_shift: page.trailing_zeros(),
            room: 1 << 40,
            growable: true,
            unmapped_pages: Vec::new(),
            mapped: size,
            live: true,
        };
        for &by in growths {
            for (offset, len) in granule_pieces(by, page) {
                seg.push_grown(seg.size + offset, len);
            }
            seg.size += by;
        }
        seg
    }

    /// Every granule's bounds, from the definition: uniform ones from 0, then the grown ones.
    fn bounds(seg: &Segment) -> Vec<(u64, u64)> {
        let mut starts: Vec<u64> = (0..seg.uniform_end).step_by(seg.granule as usize).collect();
        starts.extend(&seg.grown);
        let ends = starts.iter().skip(1).copied().chain([seg.size]);
        starts.iter().copied().zip(ends).collect()
    }

    /// `granules_inside` and `granules_touching` of every range on a page grid of a segment
    /// that grew by granules of several sizes agree with the granules' bounds.
    #[test]
    fn granule_lookups_agree_with_the_granules_bounds() {
        let page = 2 << 20;
        let seg = grown_segment(6 * page, 2 * page, &[page, 3 * page, 40 * page, page, 70 * page], page);
        let b = bounds(&seg);
        assert_eq!(seg.granules(), b.len() as u64);
        let step = page / 2;
        for from in (0..seg.size).step_by(step as usize) {
            for to in ((from + step)..=seg.size).step_by(step as usize) {
                let (addr, len) = (seg.addr + from, to - from);
                let inside: Vec<u64> =
                    (0..b.len() as u64).filter(|&i| b[i as usize].0 >= from && b[i as usize].1 <= to).collect();
                let touching: Vec<u64> =
                    (0..b.len() as u64).filter(|&i| b[i as usize].0 < to && b[i as usize].1 > from).collect();
                assert_eq!(seg.granules_inside(addr, len).collect::<Vec<_>>(), inside, "inside [{from}, {to})");
                assert_eq!(seg.granules_touching(addr, len).collect::<Vec<_>>(), touching, "touching [{from}, {to})");
            }
        }
    }
}
