//! The block arena: blocks and segments in slot vectors, the free index over the free blocks,
//! and the walks over them that reports and the invariant checks use.

use super::observe::Note;
use super::*;

impl Heap {
    pub(super) fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.free_slots.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    pub(super) fn drop_block(&mut self, i: u32) {
        let b = &mut self.blocks[i as usize];
        b.extra = None;
        b.prev = NONE;
        b.next = NONE;
        self.free_slots.push(i);
    }

    pub(super) fn pool_of_block(&self, i: u32) -> Pool {
        self.blocks[i as usize].pool
    }

    pub(super) fn is_split(&self, i: u32) -> bool {
        let b = &self.blocks[i as usize];
        b.prev != NONE || b.next != NONE
    }

    /// Counts free block `i` in the inactive-split statistics if it shares its segment.
    pub(super) fn count_split(&mut self, i: u32) {
        if self.is_split(i) {
            let pool = self.pool_of_block(i);
            self.note(Note::SplitFree { size: self.blocks[i as usize].size, pool, counted: true });
        }
    }

    /// Undoes [`count_split`](Self::count_split) before the block changes.
    pub(super) fn uncount_split(&mut self, i: u32) {
        if self.is_split(i) {
            let pool = self.pool_of_block(i);
            self.note(Note::SplitFree { size: self.blocks[i as usize].size, pool, counted: false });
        }
    }

    /// What the free index lists free block `i` under: a whole segment, and whether unmapping
    /// could give back any of its pages (constant time for blocks smaller than a page).
    pub(super) fn free_flags(&self, i: u32) -> Flags {
        let b = &self.blocks[i as usize];
        let whole = b.prev == NONE && b.next == NONE;
        if !self.can_unmap || b.size < self.page {
            return Flags { whole, mapped_pages: false };
        }
        let seg = &self.segments[b.segment as usize];
        // The page is a power of two: shifts, not divisions (this runs on every merge).
        let (shift, mask) = (self.page.trailing_zeros(), self.page - 1);
        let first = (b.addr - seg.addr + mask) >> shift;
        let end = (b.addr + b.size - seg.addr) >> shift;
        // Usually the first page answers: holes are unmapped whole or not at all.
        Flags { whole, mapped_pages: (first..end).any(|p| !Self::is_page_unmapped(seg, p)) }
    }

    /// Recomputes the free index's flags of indexed block `i` after its pages changed.
    pub(super) fn reflag(&mut self, i: u32) {
        let flags = self.free_flags(i);
        self.free.set_flags(i, flags);
    }

    /// Puts a free block in the index and counts it.
    pub(super) fn index_free(&mut self, i: u32) {
        let pool = self.pool_of_block(i);
        let b = &mut self.blocks[i as usize];
        b.state = BlockState::Free;
        let (stream, size, addr) = (b.stream, b.size, b.addr);
        let flags = self.free_flags(i);
        self.free.insert(i, pool as usize, stream, size, addr, flags);
        self.count_split(i);
    }

    /// Takes a free block out of the index and uncounts it; it is no longer `Free` (so that
    /// no merge can reach it) until it is indexed again.
    pub(super) fn unindex_free(&mut self, i: u32) {
        self.blocks[i as usize].state = BlockState::Allocated;
        let removed = self.free.remove(i);
        debug_assert!(removed, "block {i} was not in the free index");
        self.uncount_split(i);
    }

    /// The largest free block (for reports).
    pub(crate) fn largest_free(&self) -> u64 {
        self.free.iter().map(|(_, size)| size).max().unwrap_or(0)
    }

    /// Calls `f` with every block of every live segment, in address order per segment.
    pub(crate) fn for_each_block(&self, mut f: impl FnMut(u32, &Segment, &Block)) {
        for seg in self.segments.iter().filter(|s| s.live) {
            let mut i = seg.head;
            while i != NONE {
                let b = &self.blocks[i as usize];
                f(i, seg, b);
                i = b.next;
            }
        }
    }

    /// Whether free block `i` is in the free index and there listed as a whole segment, and
    /// how many blocks, and whole segments, the index holds (for the invariant checks: the
    /// lookups are linear).
    pub(crate) fn free_index_state(&self, i: u32) -> (bool, bool, usize, usize) {
        (self.free.contains(i), self.free.whole().contains(&i), self.free.len(), self.free.whole().len())
    }

    /// Whether the allocator unmaps the pages under free blocks.
    pub(crate) fn can_unmap(&self) -> bool {
        self.can_unmap
    }

    /// Whether free block `i` is on the free index's list of blocks with mapped whole pages.
    pub(crate) fn listed_with_mapped_pages(&self, i: u32) -> bool {
        self.free.with_mapped_pages().contains(&i)
    }

    /// Whether page `p` of live segment `seg` is unmapped.
    pub(crate) fn is_page_unmapped(seg: &Segment, p: u64) -> bool {
        seg.unmapped_pages[(p / 64) as usize] & (1 << (p % 64)) != 0
    }
}
