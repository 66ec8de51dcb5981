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

/// Who did it: stack, scope, thread, step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Context {
    /// Index in the stack table, or `NO_STACK`.
    pub(crate) stack: u32,
    pub(crate) scope: u32,
    pub(crate) thread: u32,
    pub(crate) step: u64,
}

pub(crate) const NO_STACK: u32 = u32::MAX;

/// One recorded event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event {
    pub(crate) action: Action,
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) stream: u32,
    /// Clock ticks since the recorder started (see `Clock`).
    pub(crate) ticks: u64,
    pub(crate) context: Option<Context>,
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
        Event { action: Action::Alloc, addr: i, size: 0, stream: 0, ticks: 0, context: None }
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
