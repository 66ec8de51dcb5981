//! Where the memory the program allocated itself is recorded ([`super::recorded`]): each
//! allocation's block by address, in order, with how it was made, and the heap's stream for
//! each of the backend's streams that memory was made on. A part of the heap of its own: only
//! its methods change it.

use super::recorded::Made;
use super::{BlockId, StreamId};
use crate::backend::RawStream;
use std::collections::{BTreeMap, HashMap};

/// The recorded allocations and their streams.
#[derive(Debug, Default)]
pub(super) struct RecordedMap {
    /// Each allocation's block and how it was made, by address (an unmapped range forgets
    /// every allocation inside it, so they are kept in order).
    blocks: BTreeMap<u64, (BlockId, Made)>,
    /// The heap's stream for each backend stream recorded memory was made on.
    streams: HashMap<RawStream, StreamId>,
}

impl RecordedMap {
    /// How the allocation recorded at `addr` was made.
    pub(super) fn made(&self, addr: u64) -> Option<Made> {
        self.blocks.get(&addr).map(|&(_, m)| m)
    }

    /// Records block `b`, made as `made`, at `addr`.
    pub(super) fn insert(&mut self, addr: u64, b: BlockId, made: Made) {
        self.blocks.insert(addr, (b, made));
    }

    /// Forgets the allocation recorded at `addr`, returning its block.
    pub(super) fn remove(&mut self, addr: u64) -> Option<BlockId> {
        self.blocks.remove(&addr).map(|(b, _)| b)
    }

    /// Forgets the allocation recorded at the lowest address in `from..=to`, returning its
    /// block.
    pub(super) fn remove_first_in(&mut self, from: u64, to: u64) -> Option<BlockId> {
        let (&a, _) = self.blocks.range(from..=to).next()?;
        self.remove(a)
    }

    /// The heap's stream for backend stream `raw`, if memory was recorded on it before.
    pub(super) fn stream(&self, raw: RawStream) -> Option<StreamId> {
        self.streams.get(&raw).copied()
    }

    /// Notes `s` as the heap's stream for backend stream `raw`.
    pub(super) fn set_stream(&mut self, raw: RawStream, s: StreamId) {
        self.streams.insert(raw, s);
    }
}
