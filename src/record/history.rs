//! The bounded ring buffer of allocator events.

use serde::{Deserialize, Serialize};

/// What happened, with PyTorch's action names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Action {
    /// A block was handed out.
    Alloc,
    /// A buffer was dropped; the block waits for other streams.
    FreeRequested,
    /// A block went back to the cache.
    FreeCompleted,
    /// A segment was reserved from the backend.
    SegmentAlloc,
    /// A segment was returned to the backend.
    SegmentFree,
    /// Pages were mapped under a segment.
    SegmentMap,
    /// Pages were unmapped from a segment.
    SegmentUnmap,
    /// A request failed for lack of memory.
    Oom,
    /// A snapshot was taken.
    Snapshot,
}

impl Action {
    /// Every action with PyTorch's name for it, in declaration order (the recorder encodes an
    /// action as its index here): the one table that the pickle reader and writer use, and
    /// that serde's names are tested against.
    pub(crate) const ALL: [(Action, &'static str); 9] = [
        (Action::Alloc, "alloc"),
        (Action::FreeRequested, "free_requested"),
        (Action::FreeCompleted, "free_completed"),
        (Action::SegmentAlloc, "segment_alloc"),
        (Action::SegmentFree, "segment_free"),
        (Action::SegmentMap, "segment_map"),
        (Action::SegmentUnmap, "segment_unmap"),
        (Action::Oom, "oom"),
        (Action::Snapshot, "snapshot"),
    ];

    /// PyTorch's name: `alloc`, `free_requested`, `segment_map`, ...
    pub fn name(self) -> &'static str {
        Action::ALL[self as usize].1
    }

    /// The action PyTorch calls `name`, if any.
    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.iter().find(|(_, n)| *n == name).map(|&(a, _)| a)
    }
}

/// Where an allocation was made: stack, scope and thread, interned per allocator (a program
/// has a bounded number of them, whatever it runs for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Site {
    /// Index in the stack table, where a stack was captured.
    pub(crate) stack: Option<u32>,
    pub(crate) scope: u32,
    pub(crate) thread: u32,
}

/// Three words, as the recorder's hasher takes them (a derived hash would feed it the
/// `Option`'s discriminant byte by byte, on every recorded allocation). A missing stack hashes
/// as `u32::MAX`, an id no stack table reaches; equality still tells them apart.
impl std::hash::Hash for Site {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u32(self.stack.unwrap_or(u32::MAX));
        state.write_u32(self.scope);
        state.write_u32(self.thread);
    }
}

/// Who did it, and in which step: 16 bytes per block and per event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Context {
    /// Index in the site table.
    pub(crate) site: u32,
    pub(crate) step: u64,
}

const SIZE_BITS: u32 = 56;

/// One recorded event, 40 bytes: the action shares a word with the size (sizes stay below
/// 2^56 bytes), so that a history of 100,000 events takes 4 MB.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event {
    pub(crate) addr: u64,
    size_action: u64,
    /// Clock ticks since the recorder started (see `Clock`).
    pub(crate) ticks: u64,
    step: u64,
    /// The context's site + 1 (`None`: no context), in the same four bytes.
    site: Option<std::num::NonZeroU32>,
    pub(crate) stream: u32,
}

impl Event {
    #[inline]
    pub(crate) fn new(action: Action, addr: u64, size: u64, stream: u32, ticks: u64, ctx: Option<Context>) -> Self {
        let code = action as u64;
        let size = size.min((1 << SIZE_BITS) - 1);
        let (site, step) =
            ctx.map_or((None, 0), |c| (c.site.checked_add(1).and_then(std::num::NonZeroU32::new), c.step));
        Event { addr, size_action: size | code << SIZE_BITS, ticks, step, site, stream }
    }

    pub(crate) fn action(&self) -> Action {
        Action::ALL[(self.size_action >> SIZE_BITS) as usize % Action::ALL.len()].0
    }

    pub(crate) fn size(&self) -> u64 {
        self.size_action & ((1 << SIZE_BITS) - 1)
    }

    pub(crate) fn context(&self) -> Option<Context> {
        self.site.map(|s| Context { site: s.get() - 1, step: self.step })
    }
}

/// A ring of at most `capacity` events; the oldest go first.
#[derive(Debug, Default)]
pub(crate) struct Ring {
    buf: Vec<Event>,
    head: usize,
    capacity: usize,
    /// Events ever pushed (including those overwritten).
    pub(crate) total: u64,
}

impl Ring {
    pub(crate) fn new(capacity: usize) -> Self {
        Ring { buf: Vec::new(), head: 0, capacity, total: 0 }
    }

    #[inline]
    pub(crate) fn push(&mut self, e: Event) {
        if self.capacity == 0 {
            return;
        }
        self.total += 1;
        if self.buf.len() < self.capacity {
            self.buf.push(e);
        } else {
            self.buf[self.head] = e;
            self.head += 1;
            if self.head == self.capacity {
                self.head = 0;
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Event> {
        self.buf[self.head..].iter().chain(&self.buf[..self.head])
    }

    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.head = 0;
    }

    /// Changes the capacity, keeping the newest events.
    pub(crate) fn set_capacity(&mut self, capacity: usize) {
        let kept: Vec<Event> = self.iter().copied().collect();
        let skip = kept.len().saturating_sub(capacity);
        self.buf = kept[skip..].to_vec();
        self.head = 0;
        self.capacity = capacity;
        if self.buf.len() == capacity {
            self.head = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(i: u64) -> Event {
        Event::new(Action::Alloc, i, 0, 0, 0, None)
    }

    #[test]
    fn events_pack_action_size_and_context() {
        assert_eq!(std::mem::size_of::<Event>(), 40);
        for (a, _) in Action::ALL {
            let e = Event::new(a, 1, 12345, 2, 3, Some(Context { site: 4, step: 5 }));
            assert_eq!((e.action(), e.size(), e.context()), (a, 12345, Some(Context { site: 4, step: 5 })));
        }
        assert_eq!(Event::new(Action::Oom, 0, u64::MAX, 0, 0, None).size(), (1 << SIZE_BITS) - 1);
        for (i, &(a, name)) in Action::ALL.iter().enumerate() {
            assert_eq!(a as usize, i, "the table is in declaration order");
            assert_eq!(Event::new(a, 0, 1, 0, 0, None).action(), a);
            assert_eq!(serde_json::to_string(&a).unwrap(), format!("\"{name}\""), "serde's name is the table's");
            assert_eq!(Action::from_name(name), Some(a));
        }
        assert!(Event::new(Action::Oom, 0, 0, 0, 0, None).context().is_none());
    }

    #[test]
    fn keeps_exactly_the_last_n() {
        let mut r = Ring::new(5);
        for i in 0..13 {
            r.push(ev(i));
        }
        assert_eq!(r.iter().map(|e| e.addr).collect::<Vec<_>>(), vec![8, 9, 10, 11, 12]);
        assert_eq!(r.total, 13);
        r.set_capacity(3);
        assert_eq!(r.iter().map(|e| e.addr).collect::<Vec<_>>(), vec![10, 11, 12]);
        r.push(ev(13));
        assert_eq!(r.iter().map(|e| e.addr).collect::<Vec<_>>(), vec![11, 12, 13]);
        r.set_capacity(10);
        r.push(ev(14));
        assert_eq!(r.len(), 4);
        r.clear();
        assert_eq!(r.len(), 0);
        let mut off = Ring::new(0);
        off.push(ev(1));
        assert_eq!(off.len(), 0);
    }
}
