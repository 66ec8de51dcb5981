//! Sizing policy: how requests round to blocks, which pool they go to, how large a segment
//! is reserved for them (PyTorch's rules), and which blocks count as oversize.

use super::*;

impl Heap {
    /// Rounds a request to a block size (PyTorch's `round_size`).
    pub(crate) fn round_size(&self, size: u64) -> Option<u64> {
        if size <= MIN_BLOCK {
            return Some(MIN_BLOCK);
        }
        let d = u64::from(self.config.divisions_for(size));
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

    /// The segment size PyTorch would choose for a block of `size`.
    pub(super) fn segment_size(&self, size: u64) -> Option<u64> {
        let s = if size <= SMALL_SIZE {
            SMALL_SEGMENT
        } else if size < MIN_LARGE_ALLOC {
            LARGE_SEGMENT
        } else {
            size
        };
        s.max(size).checked_next_multiple_of(self.page)
    }

    pub(super) fn is_oversize(&self, size: u64) -> bool {
        self.config.max_split_size.is_some_and(|m| size >= m)
    }
}
