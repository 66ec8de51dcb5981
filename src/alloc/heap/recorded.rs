//! Memory the program allocated without this allocator, recorded by it: each allocation a
//! segment of its own whose one block is allocated, so that statistics, scopes, stacks,
//! history and snapshots treat it as they treat the allocator's own blocks. The observer of
//! CUDA allocations (`vramscope::observe`) records through this; the memory is the program's,
//! and "releasing" such a segment only forgets it.

use super::accounting::Note;
use super::{BlockId, BlockState, Heap, StreamId, MIN_BLOCK};
use crate::backend::{Backend, RawStream};
use crate::error::{InvalidRequest, Result, Rounding};
use crate::record::Context;

/// How recorded memory was made, where it matters to who counts it (the ledger counts memory
/// from the driver's pool under the pool, and mappings apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Made {
    /// Allocated by a call of its own (`cuMemAlloc`, or unknown).
    #[default]
    Allocated,
    /// From the driver's stream-ordered pool (`cuMemAllocAsync`).
    #[cfg_attr(not(feature = "cupti"), allow(dead_code))]
    Pooled,
    /// A virtual-memory mapping (`cuMemMap`).
    #[cfg_attr(not(feature = "cupti"), allow(dead_code))]
    Mapped,
}

impl Heap {
    /// How each live recorded allocation was made, by address.
    pub(crate) fn recorded_made(&self, addr: u64) -> Option<Made> {
        self.recorded.made(addr)
    }

    /// Records `requested` bytes the program allocated at `addr` on stream `raw` (the
    /// backend's handle). A block still recorded at `addr` is forgotten first: its free was
    /// not seen (the program freed it through a call not observed, or before observing began).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_external_at(
        &mut self,
        backend: &dyn Backend,
        raw: RawStream,
        addr: u64,
        requested: u64,
        made: Made,
        ctx: Option<Context>,
    ) -> Result<()> {
        // Checked before anything changes: a size that cannot be rounded is refused whole.
        let size = requested
            .max(1)
            .checked_next_multiple_of(MIN_BLOCK)
            .ok_or(InvalidRequest::RoundingOverflow { requested, to: Rounding::Block })?;
        if let Some(stale) = self.recorded.remove(addr) {
            self.forget_external(backend, stale, None);
        }
        let stream = match self.recorded.stream(raw) {
            Some(s) => s,
            None => {
                let s = if raw == 0 { StreamId(0) } else { self.add_stream(raw)? };
                self.recorded.set_stream(raw, s);
                s
            }
        };
        let b = self.record_external(stream, addr, size, requested, ctx);
        self.recorded.insert(addr, b, made);
        Ok(())
    }

    /// Forgets every allocation recorded at an address in `addr..addr + len` (a free: `len`
    /// 1; a range the program unmapped); returns how many. Nothing recorded there: memory
    /// allocated before observing began, or not by an observed call.
    pub(crate) fn forget_external_range_at(
        &mut self,
        backend: &dyn Backend,
        addr: u64,
        len: u64,
        ctx: Option<Context>,
    ) -> usize {
        let Some(span) = len.checked_sub(1) else { return 0 };
        let last = addr.saturating_add(span);
        let mut forgotten = 0;
        while let Some(b) = self.recorded.remove_first_in(addr, last) {
            self.forget_external(backend, b, ctx);
            forgotten += 1;
        }
        forgotten
    }

    /// Records `requested` bytes at `addr`, allocated by the program on `stream`, as a segment
    /// of `size` bytes (`requested` rounded up to 512 bytes, as the driver aligns allocations)
    /// whose only block is allocated.
    fn record_external(
        &mut self,
        stream: StreamId,
        addr: u64,
        size: u64,
        requested: u64,
        ctx: Option<Context>,
    ) -> BlockId {
        let pool = Self::pool_of(size);
        self.accounting.serving(ctx);
        let b = self.add_segment(pool, stream, addr, size, 0);
        self.accounting.serving(None);
        self.unindex_free(b);
        let blk = &mut self.blocks[b];
        blk.state = BlockState::Allocated;
        blk.requested = requested;
        blk.ctx = ctx;
        self.note(Note::Alloc { addr, size, requested, pool, stream, ctx });
        b
    }

    /// Forgets block `b` recorded by [`record_external`](Self::record_external): the program
    /// freed it (`ctx`: who did). Its segment goes with it.
    fn forget_external(&mut self, backend: &dyn Backend, b: BlockId, ctx: Option<Context>) {
        self.free(backend, b, ctx);
        self.settle();
        self.release_segment_of(backend, b);
    }
}
