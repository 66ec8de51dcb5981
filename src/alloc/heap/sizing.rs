//! Sizing policy: how requests round to blocks, which pool they go to, how large a segment
//! is reserved for them (PyTorch's rules), and which blocks count as oversize.

use super::*;
use crate::alloc::ids::BlockId;

impl Heap {
    /// Rounds a request to a block size (PyTorch's `round_size`).
    pub(crate) fn round_size(&self, size: u64) -> Option<u64> {
        if size <= MIN_BLOCK {
            return Some(MIN_BLOCK);
        }
        let d = u64::from(self.setup.config.divisions_for(size));
        if d > 1 && size > MIN_BLOCK * d {
            // Round up to the next of `d` equal divisions between two powers of two.
            let floor = 1u64 << (63 - size.leading_zeros());
            if floor == size {
                return Some(size);
            }
            let step = (floor / d).max(MIN_BLOCK);
            return size.checked_next_multiple_of(step);
        }
        size.checked_next_multiple_of(MIN_BLOCK)
    }

    pub(super) fn pool_of(size: u64) -> Pool {
        if size <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        }
    }

    /// The pool a request of `size` bytes (rounded) on `stream` is served from: PyTorch's rule
    /// ([`Heap::pool_of`]), except where segments grow in place ([`Heap::may_grow_in_place`])
    /// and `stream` holds every segment: there every request is served from the large ones.
    /// (With several streams, memory moves between them as whole segments, small ones
    /// included: PyTorch's pools then.)
    ///
    /// Why: where segments grow, a stream's large memory is one range whose holes merge; small
    /// segments beside it are memory that range cannot use. A program's small requests often
    /// peak when its large ones do not (a model's prompt against its decoding steps), and the
    /// 2 MiB segments kept for them stay reserved at the large peak; in the one range the same
    /// pages serve both in turn. Small blocks are split off down to 512 bytes there (see
    /// [`Heap::splits`]), so that they fill the slivers large blocks leave.
    pub(super) fn pool_for(&self, size: u64, stream: StreamId) -> Pool {
        match Self::pool_of(size) {
            Pool::Small if self.setup.can_unmap && self.holds_every_segment_of_both(stream) => Pool::Large,
            pool => pool,
        }
    }

    /// Whether `stream` holds every live segment of both pools (none held: true): the heap is in
    /// effect one stream's.
    pub(super) fn holds_every_segment_of_both(&self, stream: StreamId) -> bool {
        self.holds_every_segment(stream, Pool::Small) && self.holds_every_segment(stream, Pool::Large)
    }

    /// Whether `stream` holds every live segment of `pool` (none held: true): its own count,
    /// kept in its slot, against the statistics' count of live segments.
    pub(super) fn holds_every_segment(&self, stream: StreamId, pool: Pool) -> bool {
        u64::from(self.streams[stream.index()].segments[pool as usize])
            == self.accounting.stats().segment.pool_current(pool)
    }

    /// Whether a free block of `block` bytes in segment `seg` is split to hand out all but
    /// `remaining` bytes of it. PyTorch's rules: in the small pool down to 512 bytes; in the
    /// large pool only when more than 1 MiB remains (a smaller remainder fits no large
    /// request, and stays with the block), and not for a request of at least `max_split_size`
    /// (which takes a block less than 20 MiB, or `max_non_split_rounding`, larger than itself
    /// whole), unless that much would remain (a block taken over the soft limit, see
    /// [`Heap::keeps_oversize`]). In a segment that grows in place, which serves requests of
    /// every size ([`Heap::pool_for`]), down to 512 bytes, as in PyTorch's expandable
    /// segments: the remainder is a block that small requests use, or that merges with its
    /// neighbour when that is freed.
    pub(super) fn splits(&self, seg: SegmentId, remaining: u64, block: u64) -> bool {
        let seg = &self.segments[seg];
        match seg.pool {
            Pool::Small => remaining >= MIN_BLOCK,
            Pool::Large if seg.room > 0 => remaining >= MIN_BLOCK,
            Pool::Large => {
                remaining > SMALL_SIZE
                    && (!self.is_oversize(block - remaining) || remaining >= self.non_split_rounding())
            }
        }
    }

    /// Whether PyTorch's `max_split_size` rules keep free block `block` (of `found` bytes) from
    /// a request of `size`: a request under `max_split_size` takes no block of at least it, and
    /// one of at least it no block 20 MiB (`max_non_split_rounding`) or more larger than
    /// itself, so that oversize blocks stay whole (and their segments free to release) for
    /// requests of about their size.
    ///
    /// Two places where the rules give way, because holding to them made the allocator reserve
    /// many times what it used (a program's requests seldom come back at exactly the sizes of
    /// the blocks it freed). Measured with `max_split_size_mb:128` on the sim deciding as on
    /// CUDA (`BENCHMARKS.md`, "PyTorch's `max_split_size`"):
    ///
    /// - In a segment that grows in place the rules do not apply: its free end, which grows to
    ///   whatever the step needs, would be an oversize block that small requests may not
    ///   touch, so each of them grew the range further. PyTorch's expandable segments split
    ///   such blocks too. Single-stream fixture traces reserved up to 132 times their peak of
    ///   allocated bytes; now what they reserve without the setting.
    /// - Over the soft limit ([`Heap::grow`], lending): a request takes the best fit whatever
    ///   its size instead of releasing cached memory to reserve more. Kept, the rules made
    ///   every warm pass of most traces release and reserve segments, or raised the limit
    ///   ([`crate::config::LimitMax::Auto`]) to several times the peak. This is where PyTorch
    ///   frees oversize blocks: when the device is out of memory, not at a soft limit.
    pub(super) fn keeps_oversize(&self, block: BlockId, found: u64, size: u64) -> bool {
        let Some(max) = self.setup.config.max_split_size else {
            return false;
        };
        if self.segments[self.blocks[block].segment].room > 0 {
            return false;
        }
        (size < max && found >= max) || (size >= max && found >= size + self.non_split_rounding())
    }

    /// How much larger than an oversize request a block it takes whole may be
    /// (`max_non_split_rounding_mb`; PyTorch's 20 MiB by default).
    fn non_split_rounding(&self) -> u64 {
        self.setup.config.max_non_split_rounding.unwrap_or(LARGE_SEGMENT)
    }

    /// The segment size PyTorch would choose for a block of `size`.
    pub(super) fn segment_size(&self, size: u64) -> Option<u64> {
        let s = if size <= SMALL_SIZE {
            SMALL_SEGMENT
        } else if size < MIN_LARGE_ALLOC {
            LARGE_SEGMENT
        } else {
            size
        };
        s.max(size).checked_next_multiple_of(self.setup.page)
    }

    pub(super) fn is_oversize(&self, size: u64) -> bool {
        self.setup.is_oversize(size)
    }
}
