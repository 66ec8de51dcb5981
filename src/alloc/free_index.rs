//! The index of free blocks: best fit in constant time for the common cases.
//!
//! Free blocks are kept per (stream, pool) in size-class bins: exact classes for every multiple
//! of 512 bytes up to 1 MiB, then 64 classes per power of two. Each bin is an intrusive doubly
//! linked list (links stored here, by block index), and a two-level bitmap finds the next
//! non-empty bin. Insertion and removal are O(1); a lookup takes the head of an exact bin, or
//! scans one or two log-spaced bins for the smallest block that fits, so the result is the
//! same best fit a sorted set would give. Ties: in a log-spaced bin the lowest order key (the
//! heap's `Heap::order_key`, the segment's place in reservation order then the block's
//! offset); in an exact bin the block inserted last (the most recently freed of that size),
//! where PyTorch takes the lowest address. Neither depends on an address the backend chose.
//! With this and the heap's shortcut for the block freed last set aside (a scratch build), the
//! sim replaying as on CUDA with PyTorch's rules alone reserves what PyTorch's rules give,
//! byte for byte, on all 64 single-stream fixture traces (`tests/gpu/torch_model.py`;
//! `BENCHMARKS.md`, "The whole table, PyTorch pass by pass on every trace").

use super::ids::BlockId;

const UNIT_SHIFT: u32 = 9;
/// Classes below this are exact (one size each).
const EXACT_CLASSES: usize = 2048;
const SUB_BITS: u32 = 6;
const EXACT_LOG2: u32 = 11; // log2(EXACT_CLASSES)
/// Enough classes for any `u64` size.
const CLASSES: usize = EXACT_CLASSES + ((64 - UNIT_SHIFT - EXACT_LOG2) as usize) * (1 << SUB_BITS);
const WORDS: usize = CLASSES.div_ceil(64);
const SUMMARY: usize = WORDS.div_ceil(64);

/// Classes cover half-open ranges `(lo, hi]` of 512-byte units, so that a segment of a power of
/// two and the same segment less a small block share a class (splits then resize in place).
#[inline]
fn class_of(size: u64) -> usize {
    let u = (size >> UNIT_SHIFT).saturating_sub(1);
    if u < EXACT_CLASSES as u64 {
        return u as usize;
    }
    let e = 63 - u.leading_zeros();
    let m = (u >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    EXACT_CLASSES + ((e - EXACT_LOG2) as usize) * (1 << SUB_BITS) + m as usize
}

/// The free lists of one (stream, pool): a head per size class, stored in chunks of 64 classes
/// that exist only once a class of theirs was used (a stream's blocks usually fall in one to
/// three chunks), found through a two-level bitmap. About 400 bytes for a stream with free
/// blocks of one size range, so that many streams cost little; emptied bins are dropped.
struct Bins {
    /// Which of the `WORDS` 64-class words have a non-empty class.
    summary: [u64; SUMMARY],
    /// The chunk holding each word's heads and bits (`NO_CHUNK`: never used).
    chunk_of: [u8; WORDS],
    chunks: Vec<Chunk>,
    /// Indexed blocks in these bins.
    len: u32,
    /// Where these bins' stream is in `FreeIndex::occupied` of their pool.
    pos: u32,
}

struct Chunk {
    /// Non-empty classes of this word.
    bits: u64,
    heads: [Option<BlockId>; 64],
}

const NO_CHUNK: u8 = u8::MAX;
const _: () = assert!(WORDS < NO_CHUNK as usize);

impl Bins {
    fn new() -> Box<Self> {
        Box::new(Bins { summary: [0; SUMMARY], chunk_of: [NO_CHUNK; WORDS], chunks: Vec::new(), len: 0, pos: 0 })
    }

    #[inline]
    fn head(&self, c: usize) -> Option<BlockId> {
        match self.chunk_of[c / 64] {
            NO_CHUNK => None,
            k => self.chunks[k as usize].heads[c % 64],
        }
    }

    #[inline]
    fn chunk_mut(&mut self, c: usize) -> &mut Chunk {
        let w = c / 64;
        if self.chunk_of[w] == NO_CHUNK {
            self.chunk_of[w] = self.chunks.len() as u8;
            self.chunks.push(Chunk { bits: 0, heads: [None; 64] });
        }
        &mut self.chunks[self.chunk_of[w] as usize]
    }

    /// Replaces the head of non-empty class `c` by another block (the bitmaps stay as they are).
    #[inline]
    fn replace_head(&mut self, c: usize, head: BlockId) {
        let k = self.chunk_of[c / 64];
        debug_assert!(k != NO_CHUNK);
        self.chunks[k as usize].heads[c % 64] = Some(head);
    }

    /// Sets the head of class `c`, keeping the bitmaps in step.
    #[inline]
    fn set_head(&mut self, c: usize, head: Option<BlockId>) {
        let chunk = self.chunk_mut(c);
        chunk.heads[c % 64] = head;
        if head.is_none() {
            chunk.bits &= !(1 << (c % 64));
            if chunk.bits == 0 {
                self.summary[c / 4096] &= !(1 << ((c / 64) % 64));
            }
        } else {
            chunk.bits |= 1 << (c % 64);
            self.summary[c / 4096] |= 1 << ((c / 64) % 64);
        }
    }

    fn word(&self, w: usize) -> u64 {
        match self.chunk_of[w] {
            NO_CHUNK => 0,
            k => self.chunks[k as usize].bits,
        }
    }

    /// The first non-empty class at or after `c`.
    fn next_nonempty(&self, c: usize) -> Option<usize> {
        if c >= CLASSES {
            return None;
        }
        let w = c / 64;
        let bits = self.word(w) & (!0u64 << (c % 64));
        if bits != 0 {
            return Some(w * 64 + bits.trailing_zeros() as usize);
        }
        let mut sw = (w + 1) / 64;
        let mut sbits = if w + 1 < WORDS { self.summary[sw] & (!0u64 << ((w + 1) % 64)) } else { 0 };
        loop {
            if sbits != 0 {
                let word = sw * 64 + sbits.trailing_zeros() as usize;
                return Some(word * 64 + self.word(word).trailing_zeros() as usize);
            }
            sw += 1;
            if sw >= SUMMARY {
                return None;
            }
            sbits = self.summary[sw];
        }
    }
}

#[derive(Clone, Copy)]
struct Entry {
    prev: Option<BlockId>,
    next: Option<BlockId>,
    size: u64,
    /// Among blocks of one size in a log-spaced class, the lowest key is taken first (an exact
    /// class hands out the block inserted last).
    key: u64,
    /// `stream * 2 + pool`; `None` when the block is not in the index.
    bin: Option<u32>,
    /// Position in each of `FreeIndex::lists`; `None` when the block is not on it.
    listed: [Option<u32>; LISTS],
}

const EMPTY: Entry = Entry { prev: None, next: None, size: 0, key: 0, bin: None, listed: [None; LISTS] };

/// What the heap says about a free block when it indexes or changes it; each flag puts the block
/// on one of the index's dense lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    /// The block is its segment's only block: releasing the segment gives back all of it.
    pub(crate) whole: bool,
    /// The block covers at least one whole page that is mapped: unmapping can give it back.
    pub(crate) mapped_pages: bool,
}

const LISTS: usize = 2;

impl Flags {
    fn get(self, list: usize) -> bool {
        [self.whole, self.mapped_pages][list]
    }
}

/// Emptied bins kept for reuse, so that a stream whose last free block comes and goes does not
/// allocate each time.
const SPARE_BINS: usize = 8;

/// Free blocks of every stream and pool.
///
/// Besides the size-class lists, dense lists make the reclaiming walks cost what they find,
/// not every block that ever was: the indexed blocks that are a whole segment, which
/// reclaiming releases first, and those with mapped whole pages, which it unmaps next
/// (`lists`, by [`Flags`]). Reclaiming runs before every new segment over the soft limit, so a
/// walk over all free blocks there would make allocation quadratic in the number of streams.
pub(crate) struct FreeIndex {
    bins: Vec<Option<Box<Bins>>>,
    /// Boxed as in `bins`, so that they move between the two without copying.
    #[allow(clippy::vec_box)]
    spare: Vec<Box<Bins>>,
    entries: Vec<Entry>,
    len: usize,
    lists: [Vec<BlockId>; LISTS],
    /// For each pool, the streams with free blocks in it (those whose bins exist), in no
    /// particular order: lending looks at these only, not at every stream there ever was.
    occupied: [Vec<u32>; 2],
}

impl std::fmt::Debug for FreeIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreeIndex").field("len", &self.len).field("whole", &self.lists[0].len()).finish()
    }
}

/// Removes `list[pos]` by moving the last element into its place; returns the moved element,
/// whose stored position the caller updates.
fn swap_out(list: &mut Vec<BlockId>, pos: u32) -> Option<BlockId> {
    list.swap_remove(pos as usize);
    list.get(pos as usize).copied()
}

impl FreeIndex {
    pub(crate) fn new() -> Self {
        FreeIndex {
            bins: Vec::new(),
            spare: Vec::new(),
            entries: Vec::new(),
            len: 0,
            lists: Default::default(),
            occupied: Default::default(),
        }
    }

    pub(crate) fn contains(&self, block: BlockId) -> bool {
        self.entries.get(block.index()).is_some_and(|e| e.bin.is_some())
    }

    /// Adds free block `block` of `size` bytes, of order `key` among equal sizes, for `stream`
    /// in `pool` (0 or 1).
    pub(crate) fn insert(&mut self, block: BlockId, pool: usize, stream: u32, size: u64, key: u64, flags: Flags) {
        let bin = stream as usize * 2 + pool;
        self.ensure_bins(bin);
        let i = block.index();
        if self.entries.len() <= i {
            self.entries.resize(i + 1, EMPTY);
        }
        debug_assert_eq!(self.entries[i].bin, None, "{block:?} indexed twice");
        let head = self.push_front(bin, class_of(size), block);
        self.bins[bin].as_mut().expect("the bins exist").len += 1;
        self.len += 1;
        self.entries[i] = Entry { prev: None, next: head, size, key, bin: Some(bin as u32), listed: [None; LISTS] };
        self.set_flags(block, flags);
    }

    /// Moves indexed `block` to the bins of `stream` in `pool`, keeping its size, address and
    /// flags (a segment taken over by another stream).
    pub(crate) fn rehome(&mut self, block: BlockId, pool: usize, stream: u32) {
        let e = self.entries[block.index()];
        let old = e.bin.expect("rehome of a block that is not indexed");
        let bin = stream as usize * 2 + pool;
        if old as usize == bin {
            return;
        }
        self.unlink(e);
        self.release_bin_entry(old as usize);
        self.ensure_bins(bin);
        let head = self.push_front(bin, class_of(e.size), block);
        self.bins[bin].as_mut().expect("the bins exist").len += 1;
        let e = &mut self.entries[block.index()];
        (e.prev, e.next, e.bin) = (None, head, Some(bin as u32));
    }

    /// Makes the bins of `bin` exist (from the spare ones when there are).
    fn ensure_bins(&mut self, bin: usize) {
        if self.bins.len() <= bin {
            self.bins.resize_with(bin + 1, || None);
        }
        if self.bins[bin].is_none() {
            let mut bins = self.spare.pop().unwrap_or_else(Bins::new);
            let occupied = &mut self.occupied[bin % 2];
            bins.pos = occupied.len() as u32;
            occupied.push((bin / 2) as u32);
            self.bins[bin] = Some(bins);
        }
    }

    /// One block fewer in the bins of `bin`; emptied bins go to the spare ones.
    fn release_bin_entry(&mut self, bin: usize) {
        let slot = &mut self.bins[bin];
        let bins = slot.as_mut().expect("an indexed block's bins exist");
        bins.len -= 1;
        if bins.len == 0 {
            let mut emptied = slot.take().expect("checked above");
            let occupied = &mut self.occupied[bin % 2];
            occupied.swap_remove(emptied.pos as usize);
            if let Some(&moved) = occupied.get(emptied.pos as usize) {
                let moved = self.bins[moved as usize * 2 + bin % 2].as_mut().expect("an occupied stream's bins exist");
                moved.pos = emptied.pos;
            }
            if self.spare.len() < SPARE_BINS {
                // Every list is empty again; the chunks stay allocated for the next stream.
                emptied.summary = [0; SUMMARY];
                self.spare.push(emptied);
            }
        }
    }

    /// Removes `block`; returns whether it was indexed.
    pub(crate) fn remove(&mut self, block: BlockId) -> bool {
        let Some(&e) = self.entries.get(block.index()) else { return false };
        let Some(bin) = e.bin else { return false };
        self.set_flags(block, Flags::default());
        self.unlink(e);
        self.len -= 1;
        self.entries[block.index()] = EMPTY;
        self.release_bin_entry(bin as usize);
        true
    }

    /// Puts indexed `block` on the lists its flags name and takes it off the others.
    #[inline]
    pub(crate) fn set_flags(&mut self, block: BlockId, flags: Flags) {
        let listed = self.entries[block.index()].listed;
        if listed[0].is_some() == flags.whole && listed[1].is_some() == flags.mapped_pages {
            // Nothing moves (most updates: a block's flags rarely change).
            return;
        }
        self.move_between_lists(block, flags);
    }

    /// [`FreeIndex::set_flags`]'s work where a flag changed.
    fn move_between_lists(&mut self, block: BlockId, flags: Flags) {
        for list in 0..LISTS {
            let pos = self.entries[block.index()].listed[list];
            match (flags.get(list), pos) {
                (true, None) => {
                    self.entries[block.index()].listed[list] = Some(self.lists[list].len() as u32);
                    self.lists[list].push(block);
                }
                (false, Some(pos)) => {
                    if let Some(moved) = swap_out(&mut self.lists[list], pos) {
                        self.entries[moved.index()].listed[list] = Some(pos);
                    }
                    self.entries[block.index()].listed[list] = None;
                }
                _ => {}
            }
        }
    }

    /// Makes `block` the head of class `c`'s list in bins `bin` (which exist) and returns the
    /// previous head, which the caller stores as the block's `next`.
    #[inline(always)]
    fn push_front(&mut self, bin: usize, c: usize, block: BlockId) -> Option<BlockId> {
        let bins = self.bins[bin].as_mut().expect("the bins exist");
        let head = bins.head(c);
        match head {
            Some(h) => {
                bins.replace_head(c, block);
                self.entries[h.index()].prev = Some(block);
            }
            None => bins.set_head(c, Some(block)),
        }
        head
    }

    /// Takes entry `e` (indexed) out of its class's list; the entry itself is left as it was.
    #[inline(always)]
    fn unlink(&mut self, e: Entry) {
        match e.prev {
            None => {
                let bin = e.bin.expect("an indexed block has a bin");
                let bins = self.bins[bin as usize].as_mut().expect("an indexed block's bins exist");
                match e.next {
                    Some(next) => bins.replace_head(class_of(e.size), next),
                    None => bins.set_head(class_of(e.size), None),
                }
            }
            Some(prev) => self.entries[prev.index()].next = e.next,
        }
        if let Some(next) = e.next {
            self.entries[next.index()].prev = e.prev;
        }
    }

    /// Changes the size, order key and flags of indexed `block`, in place when its class stays
    /// the same, else by moving it from one list to the other within its bins.
    pub(crate) fn update(&mut self, block: BlockId, size: u64, key: u64, flags: Flags) {
        let e = self.entries[block.index()];
        let bin = e.bin.expect("update of a block that is not indexed");
        let new = class_of(size);
        if class_of(e.size) != new {
            self.unlink(e);
            let head = self.push_front(bin as usize, new, block);
            let e = &mut self.entries[block.index()];
            e.prev = None;
            e.next = head;
        }
        let e = &mut self.entries[block.index()];
        e.size = size;
        e.key = key;
        self.set_flags(block, flags);
    }

    /// The best-fitting free block of at least `size` bytes for `stream` in `pool`: the
    /// smallest, and among equals the lowest key (exact classes take the most recently
    /// freed). Returns the block and its size.
    #[inline]
    pub(crate) fn find(&self, pool: usize, stream: u32, size: u64) -> Option<(BlockId, u64)> {
        let bins = self.bins.get(stream as usize * 2 + pool)?.as_ref()?;
        let mut c = class_of(size);
        loop {
            c = bins.next_nonempty(c)?;
            let head = bins.head(c);
            if c < EXACT_CLASSES {
                let head = head.expect("a non-empty class has a head");
                return Some((head, self.entries[head.index()].size));
            }
            if let Some(best) = self.best_in(head, size) {
                return Some(best);
            }
            c += 1;
        }
    }

    /// What [`FreeIndex::find`] would return with block `except` out of the index: the
    /// heap's second choice when its best fit is the free end of a segment that grows in
    /// place (see `Heap::find_free`). Kept beside `find` rather than sharing one body with it:
    /// the shared body, inlined either way, cost `find` 10 to 15 more instructions per
    /// operation of a replay (`benches/instructions.sh`, 1.0% on `leaky_train`, 1.7% on
    /// `gpt2_train`).
    pub(crate) fn find_except(&self, pool: usize, stream: u32, size: u64, except: BlockId) -> Option<(BlockId, u64)> {
        let bins = self.bins.get(stream as usize * 2 + pool)?.as_ref()?;
        let mut c = class_of(size);
        loop {
            c = bins.next_nonempty(c)?;
            let head = bins.head(c).expect("a non-empty class has a head");
            if c < EXACT_CLASSES {
                let first = if head == except { self.entries[head.index()].next } else { Some(head) };
                if let Some(b) = first {
                    return Some((b, self.entries[b.index()].size));
                }
            } else if let Some(best) = self.best_in_except(Some(head), size, Some(except)) {
                return Some(best);
            }
            c += 1;
        }
    }

    fn best_in(&self, next: Option<BlockId>, size: u64) -> Option<(BlockId, u64)> {
        self.best_in_except(next, size, None)
    }

    /// The smallest block of at least `size` bytes in the class list starting at `next`, the
    /// lowest key among equals, other than `except`.
    fn best_in_except(&self, mut next: Option<BlockId>, size: u64, except: Option<BlockId>) -> Option<(BlockId, u64)> {
        let mut best: Option<(u64, u64, BlockId)> = None;
        while let Some(i) = next {
            let e = &self.entries[i.index()];
            if e.size >= size && Some(i) != except && best.is_none_or(|(s, k, _)| (e.size, e.key) < (s, k)) {
                best = Some((e.size, e.key, i));
            }
            next = e.next;
        }
        best.map(|(s, _, b)| (b, s))
    }

    /// Every indexed block with its size, in no particular order (for out-of-memory reports:
    /// it walks every entry).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, u64)> + '_ {
        self.entries.iter().enumerate().filter(|(_, e)| e.bin.is_some()).map(|(i, e)| (BlockId::new(i), e.size))
    }

    /// The streams with free blocks in `pool` (0 or 1), in no particular order.
    pub(crate) fn occupied(&self, pool: usize) -> &[u32] {
        &self.occupied[pool]
    }

    /// The indexed blocks that are a whole segment, in no particular order.
    pub(crate) fn whole(&self) -> &[BlockId] {
        &self.lists[0]
    }

    /// The indexed blocks with mapped whole pages, in no particular order.
    pub(crate) fn with_mapped_pages(&self) -> &[BlockId] {
        &self.lists[1]
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Everything that decides the index's future answers, in words (tests compare two
    /// indexes with it): each bin's lists in order, the dense lists in order, and each entry.
    #[cfg(test)]
    pub(crate) fn dump(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        for (bin, bins) in self.bins.iter().enumerate() {
            let Some(bins) = bins else { continue };
            let _ = write!(out, "bin {bin} ({} blocks):", bins.len);
            for c in 0..CLASSES {
                let mut next = bins.head(c);
                if next.is_some() {
                    let _ = write!(out, " [{c}]");
                }
                while let Some(b) = next {
                    let _ = write!(out, " {}", b.index());
                    next = self.entries[b.index()].next;
                }
            }
            out.push('\n');
        }
        let _ = writeln!(out, "lists {:?}", self.lists);
        for (i, e) in self.entries.iter().enumerate().filter(|(_, e)| e.bin.is_some()) {
            let _ = writeln!(out, "{i}: {:?} {:?} {} {:#x} {:?} {:?}", e.prev, e.next, e.size, e.key, e.bin, e.listed);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u32) -> BlockId {
        BlockId::new(i as usize)
    }

    const WHOLE: Flags = Flags { whole: true, mapped_pages: false };

    #[test]
    fn classes_are_monotonic_and_in_range() {
        let mut last = 0;
        for s in (512..(64u64 << 20)).step_by(512 * 7) {
            let c = class_of(s);
            assert!(c >= last && c < CLASSES, "{s}");
            last = c;
        }
        assert!(class_of(u64::MAX) < CLASSES);
        assert_eq!(class_of(512 * 100), 99);
        assert_eq!(class_of(2 << 20), class_of((2 << 20) - 512));
    }

    #[test]
    fn best_fit_with_lowest_key() {
        let mut ix = FreeIndex::new();
        ix.insert(id(0), 1, 0, 3 << 20, 3000, Flags::default());
        ix.insert(id(1), 1, 0, (2 << 20) + 512, 2000, Flags::default());
        ix.insert(id(2), 1, 0, (2 << 20) + 512, 1000, Flags::default());
        ix.insert(id(3), 1, 1, 2 << 20, 0, Flags::default()); // another stream
        ix.insert(id(4), 0, 0, 4096, 0, Flags::default()); // another pool
        assert_eq!(ix.find(1, 0, 2 << 20), Some((id(2), (2 << 20) + 512)));
        assert_eq!(ix.find(1, 0, (2 << 20) + 1024), Some((id(0), 3 << 20)));
        assert_eq!(ix.find(1, 0, 4 << 20), None);
        assert_eq!(ix.find(0, 0, 512), Some((id(4), 4096)));
        assert_eq!(ix.find(0, 0, 8192), None);
        assert!(ix.remove(id(2)));
        assert!(!ix.remove(id(2)));
        assert_eq!(ix.find(1, 0, 2 << 20), Some((id(1), (2 << 20) + 512)));
        assert_eq!(ix.len(), 4);
        assert_eq!(ix.find(1, 7, 512), None);
    }

    #[test]
    fn update_moves_blocks_between_classes() {
        let mut ix = FreeIndex::new();
        ix.insert(id(0), 0, 0, 2 << 20, 0, Flags::default());
        ix.insert(id(1), 0, 0, 2 << 20, 1 << 30, Flags::default());
        ix.insert(id(2), 0, 0, 1 << 20, 1 << 31, Flags::default());
        // Split-like shrink of the list head (block 1) into another class, and back.
        ix.update(id(1), 1 << 20, (1 << 30) + (1 << 20), Flags::default());
        assert_eq!(ix.find(0, 0, (1 << 20) + 512), Some((id(0), 2 << 20)));
        assert_eq!(ix.find(0, 0, 1 << 20).map(|(_, s)| s), Some(1 << 20));
        ix.update(id(0), 512, 0, Flags::default());
        assert_eq!(ix.find(0, 0, (1 << 20) + 512), None, "both 2 MiB blocks moved out");
        assert_eq!(ix.find(0, 0, 512), Some((id(0), 512)));
        ix.update(id(1), 2 << 20, 1 << 30, Flags::default());
        assert_eq!(ix.find(0, 0, (1 << 20) + 512), Some((id(1), 2 << 20)));
        assert!(ix.remove(id(2)) && ix.remove(id(1)) && ix.remove(id(0)));
        assert_eq!((ix.len(), ix.find(0, 0, 512)), (0, None));
    }

    #[test]
    fn finds_across_far_bins() {
        let mut ix = FreeIndex::new();
        ix.insert(id(9), 1, 0, 1 << 40, 0, Flags::default());
        assert_eq!(ix.find(1, 0, 1 << 21), Some((id(9), 1 << 40)));
        assert_eq!(ix.find(1, 0, 512), Some((id(9), 1 << 40)));
    }

    #[test]
    fn whole_segments_and_holes_are_listed() {
        let mut ix = FreeIndex::new();
        ix.insert(id(0), 0, 0, 2 << 20, 0, WHOLE);
        ix.insert(id(1), 0, 1, 2 << 20, 1 << 30, WHOLE);
        ix.insert(id(2), 0, 1, 4096, 1 << 31, Flags::default());
        let mut whole = ix.whole().to_vec();
        whole.sort();
        assert_eq!(whole, [id(0), id(1)]);
        ix.update(id(0), 1 << 20, 1 << 20, Flags::default());
        assert_eq!(ix.whole(), [id(1)]);
        assert!(ix.remove(id(1)));
        assert!(ix.whole().is_empty());
        let mut all: Vec<usize> = ix.iter().map(|(b, _)| b.index()).collect();
        all.sort();
        assert_eq!(all, [0, 2]);
        ix.update(id(2), 8192, 1 << 31, WHOLE);
        assert_eq!(ix.whole(), [id(2)]);
    }

    #[test]
    fn the_streams_with_free_blocks_are_listed_per_pool() {
        let mut ix = FreeIndex::new();
        let sorted = |ix: &FreeIndex, pool| {
            let mut v = ix.occupied(pool).to_vec();
            v.sort();
            v
        };
        for s in 0..6 {
            ix.insert(id(s), (s % 2) as usize, s, 4096, u64::from(s) << 20, Flags::default());
            ix.insert(id(10 + s), 0, s, 8192, (u64::from(s) << 20) + 8192, Flags::default());
        }
        assert_eq!((sorted(&ix, 0), sorted(&ix, 1)), (vec![0, 1, 2, 3, 4, 5], vec![1, 3, 5]));
        // Stream 0 keeps a block in pool 0; stream 3 leaves pool 1, stream 4 pool 0.
        for b in [0, 3, 4, 14] {
            assert!(ix.remove(id(b)));
        }
        assert_eq!((sorted(&ix, 0), sorted(&ix, 1)), (vec![0, 1, 2, 3, 5], vec![1, 5]));
        ix.rehome(id(10), 0, 4);
        assert_eq!(sorted(&ix, 0), [1, 2, 3, 4, 5]);
        for b in [1, 2, 5, 11, 12, 13, 15, 10] {
            assert!(ix.remove(id(b)));
        }
        assert!(ix.occupied(0).is_empty() && ix.occupied(1).is_empty());
    }

    proptest::proptest! {
        /// `find_except(.., b)` answers as `find` does once `b` is out of the index, in exact
        /// and log-spaced classes alike.
        #[test]
        fn find_except_is_find_without_the_block(
            sizes in proptest::collection::vec((1u64..5000, 0u64..4), 1..40),
            want in 1u64..5000,
            except in 0usize..40,
        ) {
            let mut ix = FreeIndex::new();
            // Units of 512 bytes, some scaled past the exact classes (1 MiB).
            let size = |(u, scale): (u64, u64)| (u << 9) << (scale * 3);
            for (i, &s) in sizes.iter().enumerate() {
                ix.insert(id(i as u32), 1, 0, size(s), (i as u64 * 7919) % 101, Flags::default());
            }
            let except = id((except % sizes.len()) as u32);
            let want = want << 9;
            let got = ix.find_except(1, 0, want, except);
            assert!(ix.remove(except));
            proptest::prop_assert_eq!(got, ix.find(1, 0, want));
        }

        /// Best fit against a plain search over every free block: after any sequence of
        /// insertions and removals over two streams and both pools, `find` returns the smallest
        /// block that fits; among equals, the one inserted last where the size has an exact
        /// class (up to 1 MiB), else the lowest key. `find_except` is the same search without
        /// the block it leaves out.
        #[test]
        fn best_fit_is_the_plain_search(
            ops in proptest::collection::vec((0u8..4, 1u64..3000, 0u64..3, 0u32..2, 0usize..2), 1..120),
            wants in proptest::collection::vec((1u64..3000, 0u64..3), 1..16),
        ) {
            // (block, pool, stream, size, key, when inserted)
            let mut free: Vec<(u32, usize, u32, u64, u64, usize)> = Vec::new();
            let mut ix = FreeIndex::new();
            let size = |u: u64, scale: u64| (u << 9) << (scale * 4);
            for (t, &(op, u, scale, stream, pool)) in ops.iter().enumerate() {
                if op == 0 && !free.is_empty() {
                    let (b, ..) = free.remove(u as usize % free.len());
                    proptest::prop_assert!(ix.remove(id(b)));
                } else {
                    let (b, s, key) = (t as u32, size(u, scale), (u * 7919 + t as u64 * 104_729) % 65_521);
                    ix.insert(id(b), pool, stream, s, key, Flags::default());
                    free.push((b, pool, stream, s, key, t));
                }
            }
            let plain = |pool: usize, stream: u32, want: u64, except: Option<u32>| {
                free.iter()
                    .filter(|f| f.1 == pool && f.2 == stream && f.3 >= want && Some(f.0) != except)
                    .min_by(|a, b| {
                        a.3.cmp(&b.3).then_with(|| {
                            if class_of(a.3) < EXACT_CLASSES {
                                b.5.cmp(&a.5) // the one inserted last
                            } else {
                                a.4.cmp(&b.4).then_with(|| a.0.cmp(&b.0))
                            }
                        })
                    })
                    .map(|f| (id(f.0), f.3))
            };
            for &(u, scale) in &wants {
                let want = size(u, scale);
                for (pool, stream) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let got = ix.find(pool, stream, want);
                    let expected = plain(pool, stream, want, None);
                    // Equal keys of equal sizes are ties either answer may break.
                    let same = |a: Option<(BlockId, u64)>, b: Option<(BlockId, u64)>| match (a, b) {
                        (Some((x, s)), Some((y, t))) => {
                            s == t && (x == y || (class_of(s) >= EXACT_CLASSES
                                && ix.entries[x.index()].key == ix.entries[y.index()].key))
                        }
                        (a, b) => a == b,
                    };
                    proptest::prop_assert!(same(got, expected), "find({pool}, {stream}, {want}): {got:?} against {expected:?}");
                    if let Some(except) = free.first().map(|f| f.0) {
                        let got = ix.find_except(pool, stream, want, id(except));
                        let expected = plain(pool, stream, want, Some(except));
                        proptest::prop_assert!(same(got, expected), "find_except: {got:?} against {expected:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn emptied_streams_give_their_bins_back() {
        let mut ix = FreeIndex::new();
        for s in 0..1000 {
            ix.insert(id(s), 0, s, 2 << 20, u64::from(s) << 21, WHOLE);
            assert!(ix.remove(id(s)));
        }
        let held = ix.bins.iter().filter(|b| b.is_some()).count();
        assert_eq!((held, ix.len()), (0, 0));
        assert!(ix.spare.len() <= SPARE_BINS);
        assert!(ix.occupied(0).is_empty());
        // A reused (spare) bin finds nothing left over from its last stream.
        ix.insert(id(7), 0, 5000, 4096, 0, Flags::default());
        assert_eq!(ix.find(0, 5000, 2 << 20), None);
        assert_eq!(ix.find(0, 5000, 512), Some((id(7), 4096)));
    }
}
