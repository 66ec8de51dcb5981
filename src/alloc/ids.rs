//! Typed ids of the heap: a block or a segment is named by its slot, and absence is `Option`
//! (stored in the same four bytes, the id being kept as slot + 1), never a sentinel; a stream by
//! its allocator-local index.

use std::marker::PhantomData;
use std::num::NonZeroU32;
use std::ops::{Index, IndexMut};

macro_rules! slot_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub(crate) struct $name(NonZeroU32);

        impl $name {
            /// The id of slot `index`.
            #[inline]
            pub(crate) fn new(index: usize) -> Self {
                let n = u32::try_from(index + 1).ok().and_then(NonZeroU32::new);
                $name(n.expect(concat!("fewer than 2^32 - 1 ", $what, "s")))
            }

            /// Its slot.
            #[inline]
            pub(crate) fn index(self) -> usize {
                (self.0.get() - 1) as usize
            }

            /// Its slot + 1, as stored.
            #[allow(dead_code)]
            #[inline]
            pub(crate) fn raw(self) -> NonZeroU32 {
                self.0
            }

            /// The id stored as `raw` (from [`raw`](Self::raw)).
            #[allow(dead_code)]
            #[inline]
            pub(crate) fn from_raw(raw: NonZeroU32) -> Self {
                $name(raw)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!($what, " {}"), self.index())
            }
        }

        impl SlotId for $name {
            fn new(index: usize) -> Self {
                $name::new(index)
            }
            fn index(self) -> usize {
                $name::index(self)
            }
        }
    };
}

slot_id!(
    /// A block's slot in the heap.
    BlockId,
    "block"
);
slot_id!(
    /// A segment's slot in the heap.
    SegmentId,
    "segment"
);

/// An allocator-local stream: its index among the heap's streams (0: the default stream), as
/// `Stream::id` gives it and the history records it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub(crate) struct StreamId(pub(crate) u32);

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl StreamId {
    /// Its index among the heap's streams.
    #[inline]
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// Stream `s`'s bit in `Streams::unchecked`; 0 from id 64 on (such streams' loans, and loans
/// to such streams, are asked about at their free).
pub(crate) fn stream_bit(s: StreamId) -> u64 {
    1u64.checked_shl(s.0).unwrap_or(0)
}

/// The streams whose bits ([`stream_bit`]) are set in `mask`, lowest id first.
pub(crate) fn streams_in(mut mask: u64) -> impl Iterator<Item = StreamId> {
    std::iter::from_fn(move || {
        let s = (mask != 0).then(|| StreamId(mask.trailing_zeros()))?;
        mask &= mask - 1;
        Some(s)
    })
}

/// What [`Slots`] are indexed by.
pub(crate) trait SlotId: Copy {
    fn new(index: usize) -> Self;
    fn index(self) -> usize;
}

/// A vector of slots indexed by their typed id, with the ids of released slots kept for reuse.
/// A released slot keeps its item (the heap marks blocks and segments dead itself), so that
/// ids stay valid indexes and iteration sees every slot ever filled.
#[derive(Debug, Clone)]
pub(crate) struct Slots<I, T> {
    items: Vec<T>,
    /// Released slots, the last released reused first.
    released: Vec<I>,
    id: PhantomData<I>,
}

impl<I: SlotId, T> Slots<I, T> {
    pub(crate) fn new() -> Self {
        Slots { items: Vec::new(), released: Vec::new(), id: PhantomData }
    }

    /// Stores `item` in the slot released last, or a new one; returns its id. Always inlined:
    /// otherwise a block is copied into the call on every split (1.4% more instructions per
    /// replayed operation, `benches/instructions.sh`).
    #[inline(always)]
    pub(crate) fn insert(&mut self, item: T) -> I {
        match self.released.pop() {
            Some(id) => {
                self.items[id.index()] = item;
                id
            }
            None => {
                self.items.push(item);
                I::new(self.items.len() - 1)
            }
        }
    }

    /// Makes slot `id` free for the next [`Slots::insert`]; its item stays until then.
    #[inline]
    pub(crate) fn release(&mut self, id: I) {
        self.released.push(id);
    }

    /// Every slot with its id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (I, &T)> + '_ {
        self.items.iter().enumerate().map(|(i, x)| (I::new(i), x))
    }
}

impl<I: SlotId, T> Index<I> for Slots<I, T> {
    type Output = T;
    #[inline]
    fn index(&self, id: I) -> &T {
        &self.items[id.index()]
    }
}

impl<I: SlotId, T> IndexMut<I> for Slots<I, T> {
    #[inline]
    fn index_mut(&mut self, id: I) -> &mut T {
        &mut self.items[id.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_slots_and_absence_costs_nothing() {
        assert_eq!(std::mem::size_of::<Option<BlockId>>(), 4);
        let mut s: Slots<BlockId, &str> = Slots::new();
        let (a, b) = (s.insert("a"), s.insert("b"));
        assert_eq!((a.index(), b.index(), s[b]), (0, 1, "b"));
        assert_eq!(format!("{b:?}"), "block 1");
        assert_eq!(s.iter().map(|(i, x)| (i, *x)).collect::<Vec<_>>(), [(a, "a"), (b, "b")]);
        // A released slot is reused, the last released first; its item stays until then.
        s.release(a);
        s.release(b);
        assert_eq!(s[a], "a");
        assert_eq!((s.insert("c"), s.insert("d"), s.insert("e").index()), (b, a, 2));
        assert_eq!((s[a], s[b]), ("d", "c"));
    }
}
