//! The read budget of a PyTorch pickle: the work it may make the reader do and the memory
//! what is read may take.

use super::bad;
use crate::error::Result;

/// How much work reading a pickle may do: the logical elements it expands to (segments, blocks,
/// frames, events, and the fields looked up in each) and the bytes of text it copies (one
/// element per [`BYTES_PER_ELEMENT`] bytes), against a budget proportional to its size. A
/// pickle's memo lets one list or string appear many times for a few bytes each, so a small
/// file can stand for billions of blocks or gigabytes of text. The 17 PyTorch snapshots under
/// `fixtures/torch` spend 0.18 to 0.60 elements per byte of the file (text included), far below
/// the budget's 8 per byte; what the budget lets a file copy is at most twice the budget in
/// bytes, 16 times the file's size plus 2 MB. Values the pickle shares and the reader keeps
/// once (frames, stacks, scope paths) are read and paid for once, at their first reference;
/// what each reference copies (a compile context, settings) is paid for at each.
///
/// What the reader keeps of the file (the history's entries, the segments' blocks) is also
/// bounded by the read limit, checked before it is built: a file that stands for millions of
/// events in a few bytes each is refused at once, not after it filled memory.
///
/// A file read as it is parsed (a gzipped one, whose size is known only at its end) earns its
/// budget as its bytes are read ([`Budget::grow`]).
pub(super) struct Budget {
    spent: u64,
    total: u64,
    /// Bytes held for what the reader keeps, against
    /// [`ReadLimit::keep`](crate::snapshot::ReadLimit::keep) of the bytes read.
    held: u64,
    /// The pickle's bytes read so far.
    read: u64,
    limit: crate::snapshot::ReadLimit,
}

impl Budget {
    pub(super) fn for_bytes(n: usize, limit: crate::snapshot::ReadLimit) -> Budget {
        let mut budget = Budget { spent: 0, total: 0, held: 0, read: 0, limit };
        budget.grow(n);
        budget
    }

    /// Counts the pickle's bytes read so far (`read`, if more than counted).
    pub(super) fn grow(&mut self, read: usize) {
        self.read = self.read.max(read as u64);
        self.total = 1_000_000u64.saturating_add(self.read.saturating_mul(8));
    }

    /// Holds memory for `n` values of type `T` read at `at`, or says the file expands past
    /// the read limit.
    pub(super) fn hold<T>(&mut self, n: usize, at: &dyn Fn() -> String, source: &str) -> Result<()> {
        let bytes = (n as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        let keep = self.limit.keep_bytes(self.read);
        match self.held.checked_add(bytes).filter(|&held| held <= keep) {
            Some(held) => {
                self.held = held;
                Ok(())
            }
            None => Err(bad(
                source,
                format!(
                    "{}: {n} entries would take {}, past what the reader may keep ({}); to read it, \
                     set a read limit (--read-limit SIZE, or {}=SIZE)",
                    at(),
                    crate::error::fmt_bytes(bytes),
                    self.limit.keep(self.read).1,
                    crate::snapshot::READ_LIMIT_ENV,
                ),
            )),
        }
    }

    /// Gives back what [`Budget::hold`] held for `n` values of type `T`.
    pub(super) fn release<T>(&mut self, n: usize) {
        self.held = self.held.saturating_sub((n as u64).saturating_mul(std::mem::size_of::<T>() as u64));
    }

    /// Spends the elements that copying `bytes` bytes of text costs.
    pub(super) fn spend_bytes(&mut self, bytes: usize, at: &dyn Fn() -> String, source: &str) -> Result<()> {
        self.spend(bytes.div_ceil(BYTES_PER_ELEMENT), at, source)
    }

    /// Spends `n` elements for what is read at `at`, or says the file expands too far.
    #[inline]
    pub(super) fn spend(&mut self, n: usize, at: &dyn Fn() -> String, source: &str) -> Result<()> {
        match self.spent.checked_add(n as u64).filter(|&spent| spent <= self.total) {
            Some(spent) => {
                self.spent = spent;
                Ok(())
            }
            None => Err(self.spent_out(at, source)),
        }
    }

    #[cold]
    fn spent_out(&self, at: &dyn Fn() -> String, source: &str) -> crate::error::Error {
        bad(
            source,
            format!(
                "{}: the pickle expands to more than {} elements (8 per byte of the file, plus a \
                 million; copied text counts one per {BYTES_PER_ELEMENT} bytes): shared references \
                 repeat the same data far beyond what a memory snapshot holds, refused",
                at(),
                self.total
            ),
        )
    }
}

/// Bytes of copied text that cost one element of the [`Budget`].
pub(super) const BYTES_PER_ELEMENT: usize = 2;
