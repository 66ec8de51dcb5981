//! The index of free blocks: best fit in constant time for the common cases.
//!
//! Free blocks are kept per (stream, pool) in size-class bins: exact classes for every multiple
//! of 512 bytes below 1 MiB, then 64 classes per power of two. Each bin is an intrusive doubly
//! linked list (links stored here, by block index), and a two-level bitmap finds the next
//! non-empty bin. Insertion and removal are O(1); a lookup takes the head of an exact bin, or
//! scans one or two log-spaced bins for the smallest block that fits, so the result is the
//! same best fit a sorted set would give (ties broken by lowest address).

use super::heap::NONE;

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

struct Bins {
    heads: Box<[u32; CLASSES]>,
    words: [u64; WORDS],
    summary: [u64; SUMMARY],
}

impl Bins {
    fn new() -> Self {
        Bins { heads: Box::new([NONE; CLASSES]), words: [0; WORDS], summary: [0; SUMMARY] }
    }

    fn set(&mut self, c: usize) {
        self.words[c / 64] |= 1 << (c % 64);
        self.summary[c / 4096] |= 1 << ((c / 64) % 64);
    }

    fn clear(&mut self, c: usize) {
        self.words[c / 64] &= !(1 << (c % 64));
        if self.words[c / 64] == 0 {
            self.summary[c / 4096] &= !(1 << ((c / 64) % 64));
        }
    }

    /// The first non-empty class at or after `c`.
    fn next_nonempty(&self, c: usize) -> Option<usize> {
        if c >= CLASSES {
            return None;
        }
        let w = c / 64;
        let bits = self.words[w] & (!0u64 << (c % 64));
        if bits != 0 {
            return Some(w * 64 + bits.trailing_zeros() as usize);
        }
        let mut sw = (w + 1) / 64;
        let mut sbits = if w + 1 < WORDS { self.summary[sw] & (!0u64 << ((w + 1) % 64)) } else { 0 };
        loop {
            if sbits != 0 {
                let word = sw * 64 + sbits.trailing_zeros() as usize;
                return Some(word * 64 + self.words[word].trailing_zeros() as usize);
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
    prev: u32,
    next: u32,
    size: u64,
    addr: u64,
    /// `stream * 2 + pool`, or `NONE` when the block is not in the index.
    bin: u32,
}

const EMPTY: Entry = Entry { prev: NONE, next: NONE, size: 0, addr: 0, bin: NONE };

/// Free blocks of every stream and pool.
pub(crate) struct FreeIndex {
    bins: Vec<Option<Bins>>,
    entries: Vec<Entry>,
    len: usize,
}

impl std::fmt::Debug for FreeIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreeIndex").field("len", &self.len).finish()
    }
}

impl FreeIndex {
    pub(crate) fn new() -> Self {
        FreeIndex { bins: Vec::new(), entries: Vec::new(), len: 0 }
    }

    pub(crate) fn contains(&self, block: u32) -> bool {
        self.entries.get(block as usize).is_some_and(|e| e.bin != NONE)
    }

    /// Adds free block `block` of `size` bytes at `addr` for `stream` in `pool` (0 or 1).
    pub(crate) fn insert(&mut self, block: u32, pool: usize, stream: u32, size: u64, addr: u64) {
        let bin = stream as usize * 2 + pool;
        if self.bins.len() <= bin {
            self.bins.resize_with(bin + 1, || None);
        }
        self.bins[bin].get_or_insert_with(Bins::new);
        let head = self.push_front(bin, class_of(size), block);
        let i = block as usize;
        if self.entries.len() <= i {
            self.entries.resize(i + 1, EMPTY);
        }
        debug_assert_eq!(self.entries[i].bin, NONE, "block {block} indexed twice");
        self.entries[i] = Entry { prev: NONE, next: head, size, addr, bin: bin as u32 };
        self.len += 1;
    }

    /// Removes `block`; returns whether it was indexed.
    pub(crate) fn remove(&mut self, block: u32) -> bool {
        let Some(&e) = self.entries.get(block as usize) else { return false };
        if e.bin == NONE {
            return false;
        }
        self.unlink(e);
        self.entries[block as usize] = EMPTY;
        self.len -= 1;
        true
    }

    /// Makes `block` the head of class `c`'s list in bins `bin` (which exist) and returns the
    /// previous head, which the caller stores as the block's `next`.
    #[inline]
    fn push_front(&mut self, bin: usize, c: usize, block: u32) -> u32 {
        let bins = self.bins[bin].as_mut().expect("the bins exist");
        let head = bins.heads[c];
        if head == NONE {
            bins.set(c);
        } else {
            self.entries[head as usize].prev = block;
        }
        bins.heads[c] = block;
        head
    }

    /// Takes entry `e` (indexed) out of its class's list; the entry itself is left as it was.
    #[inline]
    fn unlink(&mut self, e: Entry) {
        let bins = self.bins[e.bin as usize].as_mut().expect("an indexed block's bins exist");
        if e.prev == NONE {
            let c = class_of(e.size);
            bins.heads[c] = e.next;
            if e.next == NONE {
                bins.clear(c);
            }
        } else {
            self.entries[e.prev as usize].next = e.next;
        }
        if e.next != NONE {
            self.entries[e.next as usize].prev = e.prev;
        }
    }

    /// Changes the size and address of indexed `block`, in place when its class stays the same,
    /// else by moving it from one list to the other within its bins (no index growth checks).
    pub(crate) fn update(&mut self, block: u32, size: u64, addr: u64) {
        let e = self.entries[block as usize];
        debug_assert_ne!(e.bin, NONE, "update of a block that is not indexed");
        let new = class_of(size);
        if class_of(e.size) != new {
            self.unlink(e);
            let head = self.push_front(e.bin as usize, new, block);
            let e = &mut self.entries[block as usize];
            e.prev = NONE;
            e.next = head;
        }
        let e = &mut self.entries[block as usize];
        e.size = size;
        e.addr = addr;
    }

    /// The best-fitting free block of at least `size` bytes for `stream` in `pool`: the
    /// smallest, and among equals the lowest address (exact classes take the most recently
    /// freed). Returns the block and its size.
    #[inline]
    pub(crate) fn find(&self, pool: usize, stream: u32, size: u64) -> Option<(u32, u64)> {
        let bins = self.bins.get(stream as usize * 2 + pool)?.as_ref()?;
        let mut c = class_of(size);
        loop {
            c = bins.next_nonempty(c)?;
            let head = bins.heads[c];
            if c < EXACT_CLASSES {
                return Some((head, self.entries[head as usize].size));
            }
            if let Some(best) = self.best_in(head, size) {
                return Some(best);
            }
            c += 1;
        }
    }

    fn best_in(&self, mut i: u32, size: u64) -> Option<(u32, u64)> {
        let mut best: Option<(u64, u64, u32)> = None;
        while i != NONE {
            let e = &self.entries[i as usize];
            if e.size >= size && best.is_none_or(|(s, a, _)| (e.size, e.addr) < (s, a)) {
                best = Some((e.size, e.addr, i));
            }
            i = e.next;
        }
        best.map(|(s, _, b)| (b, s))
    }

    /// Every indexed block with its size, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.entries.iter().enumerate().filter(|(_, e)| e.bin != NONE).map(|(i, e)| (i as u32, e.size))
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn best_fit_with_lowest_address() {
        let mut ix = FreeIndex::new();
        ix.insert(0, 1, 0, 3 << 20, 3000);
        ix.insert(1, 1, 0, (2 << 20) + 512, 2000);
        ix.insert(2, 1, 0, (2 << 20) + 512, 1000);
        ix.insert(3, 1, 1, 2 << 20, 0); // another stream
        ix.insert(4, 0, 0, 4096, 0); // another pool
        assert_eq!(ix.find(1, 0, 2 << 20), Some((2, (2 << 20) + 512)));
        assert_eq!(ix.find(1, 0, (2 << 20) + 1024), Some((0, 3 << 20)));
        assert_eq!(ix.find(1, 0, 4 << 20), None);
        assert_eq!(ix.find(0, 0, 512), Some((4, 4096)));
        assert_eq!(ix.find(0, 0, 8192), None);
        assert!(ix.remove(2));
        assert!(!ix.remove(2));
        assert_eq!(ix.find(1, 0, 2 << 20), Some((1, (2 << 20) + 512)));
        assert_eq!(ix.len(), 4);
        assert_eq!(ix.find(1, 7, 512), None);
    }

    #[test]
    fn update_moves_blocks_between_classes() {
        let mut ix = FreeIndex::new();
        ix.insert(0, 0, 0, 2 << 20, 0);
        ix.insert(1, 0, 0, 2 << 20, 1 << 30);
        ix.insert(2, 0, 0, 1 << 20, 1 << 31);
        // Split-like shrink of the list head (block 1) into another class, and back.
        ix.update(1, 1 << 20, (1 << 30) + (1 << 20));
        assert_eq!(ix.find(0, 0, (1 << 20) + 512), Some((0, 2 << 20)));
        assert_eq!(ix.find(0, 0, 1 << 20).map(|(_, s)| s), Some(1 << 20));
        ix.update(0, 512, 0);
        assert_eq!(ix.find(0, 0, (1 << 20) + 512), None, "both 2 MiB blocks moved out");
        assert_eq!(ix.find(0, 0, 512), Some((0, 512)));
        ix.update(1, 2 << 20, 1 << 30);
        assert_eq!(ix.find(0, 0, (1 << 20) + 512), Some((1, 2 << 20)));
        assert!(ix.remove(2) && ix.remove(1) && ix.remove(0));
        assert_eq!((ix.len(), ix.find(0, 0, 512)), (0, None));
    }

    #[test]
    fn finds_across_far_bins() {
        let mut ix = FreeIndex::new();
        ix.insert(9, 1, 0, 1 << 40, 0);
        assert_eq!(ix.find(1, 0, 1 << 21), Some((9, 1 << 40)));
        assert_eq!(ix.find(1, 0, 512), Some((9, 1 << 40)));
    }
}
