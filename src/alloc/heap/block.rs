//! What the arena holds: blocks, the rarer parts of allocated ones, and segments.

use crate::alloc::ids::{BlockId, SegmentId, StreamId};
use crate::alloc::stats::Pool;
use crate::record::Context;

/// Where a block stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockState {
    /// In the free index, ready for reuse on its stream.
    Free,
    /// Handed out to a live buffer.
    Allocated,
    /// Its buffer was dropped; waiting for events on other streams that used it.
    PendingFree,
    /// Its buffer was dropped, but a stream it was used on could neither record an event nor
    /// synchronize: kept out of use for good (counted as active, never reused).
    Stranded,
    /// A page of the range that a view's block in use maps at another address (see
    /// `alias.rs`): neither free nor allocated, counted only through the view's block.
    Aliased,
}

/// A tensor's description, kept with its block for reports.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    /// Element type name, e.g. `float32`.
    pub dtype: String,
    /// Shape, outermost dimension first.
    pub shape: Vec<usize>,
}

#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// Bytes the caller asked for (0 while free).
    pub(crate) requested: u64,
    pub(crate) segment: SegmentId,
    pub(crate) prev: Option<BlockId>,
    pub(crate) next: Option<BlockId>,
    /// Allocator-local stream the block belongs to.
    pub(crate) stream: StreamId,
    pub(crate) state: BlockState,
    /// Whether some page inside this free block may be unmapped.
    pub(crate) unmapped: bool,
    /// Whether this is a view's block (`alias.rs`): it lies at the view's addresses, in no
    /// segment's list; its free gives the view's pages back to the range.
    pub(crate) view: bool,
    /// The pool of the block's segment.
    pub(crate) pool: Pool,
    /// Outstanding events before a pending free completes.
    pub(crate) pending_events: u32,
    /// What only some blocks carry, boxed to keep blocks small.
    pub(crate) extra: Option<Box<Extra>>,
    /// Who allocated it, where recorded.
    pub(crate) ctx: Option<Context>,
}

/// The rarer parts of an allocated block.
#[derive(Debug, Clone, Default)]
pub(crate) struct Extra {
    /// Other streams the block was used on (`record_stream`).
    pub(crate) uses: Vec<StreamId>,
    /// The stream a block of another stream's segment was lent to (see [`Heap::lend`]): the
    /// stream its allocation and free are recorded on.
    pub(crate) lent_to: Option<StreamId>,
    /// Whether it was lent from another stream's range while that stream was idle
    /// ([`Heap::serve_from_range`]): its free, while the borrower's work still runs, waits for an
    /// event on the borrower instead of ordering the owner after it ([`Heap::hand_back`]).
    pub(crate) from_range: bool,
    /// Whether a lent block was used on its owner's stream too (`record_stream` with the
    /// stream of its segment, which needs no event): its return then is not clean (see
    /// [`Heap::hand_back`]).
    pub(crate) used_by_owner: bool,
    pub(crate) meta: Option<TensorMeta>,
}

#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// The segment's place in reservation order, shifted above any offset in it (see
    /// [`Heap::order_key`]).
    pub(crate) order: u64,
    pub(crate) pool: Pool,
    pub(crate) stream: StreamId,
    /// First block (lowest address).
    pub(crate) head: Option<BlockId>,
    /// Last block (highest address): the free end a range grows from, found without walking
    /// the range's blocks ([`Heap::growth_plan`] runs on every request a view may serve).
    pub(crate) tail: Option<BlockId>,
    /// The unit in which the segment's first `uniform_end` bytes are mapped and unmapped: the
    /// backend's page, or on a backend that can unmap the
    /// [`map_granule`](crate::backend::map_granule) of the size it was reserved with.
    pub(crate) granule: u64,
    /// The size the segment was reserved with, mapped in `granule`s.
    pub(crate) uniform_end: u64,
    /// Where each granule the segment grew by starts (offsets, ascending, the first at
    /// `uniform_end`): each growth maps its bytes in granules of its own (see `expand.rs`).
    pub(crate) grown: Vec<u64>,
    /// For each page after `uniform_end`, the index in `grown` of the granule holding it: the
    /// granule at an offset in one step instead of a binary search (this runs on every free
    /// and split of a block at least a page long).
    pub(crate) grown_at_page: Vec<u32>,
    /// The backend's page, as a shift.
    pub(crate) page_shift: u32,
    /// Addresses reserved after the segment's end that it may grow into (0: none).
    pub(crate) room: u64,
    /// Whether the segment was reserved with room to grow in place (counted in
    /// [`StreamSlot::growable`] while live; see [`Heap::may_grow_in_place`]).
    pub(crate) growable: bool,
    /// One bit per granule: set when unmapped.
    pub(crate) unmapped_pages: Vec<u64>,
    pub(crate) mapped: u64,
    pub(crate) live: bool,
}

impl Block {
    /// A free block of fresh memory: a new segment's, or what a segment grew by (after `prev`).
    pub(super) fn fresh(
        addr: u64,
        size: u64,
        segment: SegmentId,
        pool: Pool,
        stream: StreamId,
        prev: Option<BlockId>,
    ) -> Self {
        Block {
            addr,
            size,
            requested: 0,
            segment,
            pool,
            prev,
            next: None,
            stream,
            state: BlockState::Free,
            unmapped: false,
            view: false,
            pending_events: 0,
            extra: None,
            ctx: None,
        }
    }
}
