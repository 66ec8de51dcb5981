//! The one path from what happens in the heap to what is counted and recorded. The heap's
//! algorithms say what happened ([`Note`]); [`Heap::note`] turns each happening into the
//! statistics (PyTorch's counters) and the history events it implies, so that neither is
//! woven into the algorithms, and a counter's rule is read in one place.
//!
//! What is counted and recorded is a part of its own, [`Accounting`]: its fields are private
//! to this file, so the statistics and the history change here or through its named methods
//! (the public resets, the recorder's settings), nowhere else.

use super::{BlockState, Heap, Pool, Stats, StreamId, Trips};
use crate::alloc::park::Logged;
use crate::record::{Action, Context, Pending, RecordConfig, Recorder};

/// The heap's statistics and history, with what deciding them needs.
#[derive(Debug)]
pub(super) struct Accounting {
    stats: Stats,
    /// Stacks, history and what to record.
    recorder: Recorder,
    /// Who made the request being served, while [`Heap::alloc`] runs: the segments it
    /// reserves and the pages it maps are recorded as its doing, as PyTorch's `segment_alloc`
    /// and `segment_map` entries carry the stack of the allocation that caused them.
    request_ctx: Option<Context>,
    /// Set during [`Heap::free_unrecorded`]: the free's history event was logged elsewhere.
    free_logged: bool,
    /// Whether the inactive-split peaks were reset to what merging the block kept aside
    /// leaves ([`Heap::reset_peaks`]), which may lie below their current values: handed out
    /// unmerged instead, the block lifts them to the current values. Merged, it leaves
    /// them right; the flag may outlive it (lifting a peak to its current value is always
    /// right), and is not cleared there: a store on every merge cost a replayed operation
    /// about 4 instructions (`benches/instructions.sh`).
    peaks_behind: bool,
    /// The last error a `Drop` (or a background step) could not report.
    last_error: Option<String>,
}

impl Accounting {
    pub(super) fn new(stats: Stats, record: RecordConfig) -> Self {
        Accounting {
            stats,
            recorder: Recorder::new(record),
            request_ctx: None,
            free_logged: false,
            peaks_behind: false,
            last_error: None,
        }
    }

    #[inline]
    pub(super) fn stats(&self) -> &Stats {
        &self.stats
    }

    pub(super) fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// Sets who made the request being served (`None` when it is done).
    #[inline]
    pub(super) fn serving(&mut self, ctx: Option<Context>) {
        self.request_ctx = ctx;
    }

    /// Whether the free about to be noted was logged already (by a thread's parking slot).
    #[inline]
    pub(super) fn free_logged_elsewhere(&mut self, logged: bool) {
        self.free_logged = logged;
    }

    /// Keeps `message` as the last error nobody could be told of.
    #[cold]
    pub(super) fn keep_error(&mut self, message: String) {
        self.last_error = Some(message);
    }

    pub(super) fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Whether the inactive-split peaks may lie below their current values (see
    /// [`Accounting::peaks_behind`]'s field).
    #[inline]
    pub(super) fn peaks_behind(&self) -> bool {
        self.peaks_behind
    }

    /// Every peak to its current value; with `settled`, the inactive-split peaks to those
    /// statistics' (what merging the block kept aside leaves).
    pub(super) fn reset_peaks(&mut self, settled: Option<Stats>) {
        self.stats.reset_peaks();
        self.peaks_behind = settled.is_some();
        if let Some(settled) = settled {
            self.stats.inactive_split.set_peaks_to(&settled.inactive_split);
            self.stats.inactive_split_bytes.set_peaks_to(&settled.inactive_split_bytes);
        }
    }

    /// The block kept aside was handed out unmerged after [`Accounting::reset_peaks`] set
    /// the inactive-split peaks to what merging it would have left: they must not stay below
    /// the current values.
    #[cold]
    #[inline(never)]
    pub(super) fn lift_split_peaks(&mut self) {
        self.stats.inactive_split.lift_peaks();
        self.stats.inactive_split_bytes.lift_peaks();
        self.peaks_behind = false;
    }

    pub(super) fn reset_accumulated(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Stores a captured stack in the recorder's tables (no history event).
    pub(super) fn intern(&mut self, p: Pending) -> Context {
        p.intern(&mut self.recorder)
    }

    pub(super) fn set_record_config(&mut self, config: RecordConfig) {
        self.recorder.set_config(config);
    }

    pub(super) fn clear_history(&mut self) {
        self.recorder.history.clear();
    }
}

/// Something that happened to blocks, segments or pages, with what the statistics and the
/// history need to know about it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Note {
    /// A block was handed out to a buffer: allocated and active.
    Alloc { addr: u64, size: u64, requested: u64, pool: Pool, stream: StreamId, ctx: Option<Context> },
    /// A buffer was dropped: its block is no longer allocated. With `waiting`, other streams
    /// still use it (a `free_requested` now, `free_completed` later), else it is free at once.
    Release { addr: u64, size: u64, requested: u64, pool: Pool, stream: StreamId, ctx: Option<Context>, waiting: bool },
    /// The last stream a dropped block waited for is done with it (`free_completed`).
    WaitOver { addr: u64, requested: u64, stream: StreamId },
    /// No stream uses a dropped block any more: it leaves the active counters.
    Deactivate { size: u64, pool: Pool },
    /// A free block is kept out of use (another stream's work may still use it, and that
    /// stream could be neither waited for nor synchronized): it joins the active counters.
    Strand { size: u64, pool: Pool },
    /// A free block that shares its segment with others starts (`true`) or stops being one:
    /// the inactive-split counters.
    SplitFree { size: u64, pool: Pool, counted: bool },
    /// A segment was reserved from the backend (`growable`: with room to grow in place).
    SegmentReserved { addr: u64, size: u64, pool: Pool, stream: StreamId, growable: bool },
    /// A segment was given back to the backend, `mapped` bytes of it still mapped.
    SegmentReleased { addr: u64, size: u64, mapped: u64, pool: Pool, stream: StreamId, growable: bool },
    /// A cached segment moved from stream `from` to stream `to` (no backend call): it leaves
    /// one stream and joins the other in the history, as a replay of the trace would see it.
    SegmentAdopted { addr: u64, size: u64, pool: Pool, from: StreamId, to: StreamId, growable: bool },
    /// Pages `[addr, addr + len)` of a segment were mapped (`true`) or unmapped.
    Pages { addr: u64, len: u64, pool: Pool, stream: StreamId, mapped: bool },
    /// A view of the range's pages was mapped (`true`) or given back: a backend call that
    /// reserves nothing (`alias.rs`).
    View { mapped: bool },
    /// A request failed for lack of memory, the device having `device_free` bytes free.
    Oom { requested: u64, device_free: u64 },
    /// A request failed once and is retried after releasing the cache.
    Retry,
    /// Every stream was synchronized to complete the frees waiting on them.
    SyncAllStreams,
    /// A backend call failed other than for lack of memory.
    BackendError,
    /// The fragmentation limit rose because holding to it churned.
    LimitRaised,
    /// A segment grew in place past the oversize threshold: it counts as oversize from then.
    GrewOversize,
    /// The backend was asked whether a stream's queued work is done.
    StreamQuery,
    /// A snapshot was taken: PyTorch's `snapshot` entry in the history.
    Snapshot,
}

impl Heap {
    /// Counts the round trips made through threads' parking slots since the last pull (see
    /// `park`): an allocation and a free each, of a block that stays allocated.
    pub(crate) fn note_round_trips(&mut self, t: &Trips) {
        let st = &mut self.accounting.stats;
        for (pool, [n, bytes, requested]) in [Pool::Small, Pool::Large].into_iter().zip(t.pools) {
            st.allocation.add_round_trips(pool, n);
            st.active.add_round_trips(pool, n);
            st.allocated_bytes.add_round_trips(pool, bytes);
            st.active_bytes.add_round_trips(pool, bytes);
            st.requested_bytes.add_round_trips(pool, requested);
        }
        st.oversize_allocations.allocated += t.oversize;
        // Each round trip was a free and an allocation of the block freed last on its stream
        // (the heap's shortcut): the free made the stream's free blocks unsettled and the
        // allocation marked the stream as allocating, which later decisions read (lending
        // from its range, taking its segments over). No locked operation came between the
        // trips and this pull, so noting them now decides as noting them then.
        for s in crate::alloc::ids::streams_in(t.streams) {
            self.streams.note_freed(s);
            self.streams.mark_allocating(s);
        }
    }

    /// Records what a thread logged for block `i`, which it parked or took back (see
    /// `alloc::park`): the history event, at the time it happened, and for a block taken back
    /// its new context. The block is still allocated in the heap.
    pub(crate) fn note_logged(&mut self, e: Logged) {
        let b = &mut self.blocks[e.block];
        debug_assert_eq!(b.state, BlockState::Allocated);
        let (addr, requested, stream) = (b.addr, b.requested, b.stream);
        let action = if e.alloc.is_some() {
            b.ctx = e.alloc;
            Action::Alloc
        } else {
            Action::FreeCompleted
        };
        self.accounting.recorder.event_at(action, addr, requested, stream.0, e.alloc, e.ticks);
    }

    /// Counts and records `n`. Always inlined: each caller names one kind of note, so the
    /// match folds away and the hot paths pay nothing for the indirection.
    #[inline(always)]
    pub(super) fn note(&mut self, n: Note) {
        let setup = &self.setup;
        let a = &mut self.accounting;
        let st = &mut a.stats;
        match n {
            Note::GrewOversize => st.oversize_segments.inc(1),
            Note::StreamQuery => st.num_stream_queries += 1,
            Note::Alloc { addr, size, requested, pool, stream, ctx } => {
                // The history records the bytes asked for, as PyTorch's trace does (its viewer
                // draws a block that width; the block's size is in the segment).
                a.recorder.event(Action::Alloc, addr, requested, stream.0, ctx);
                st.allocation.inc(pool, 1);
                st.allocated_bytes.inc(pool, size);
                st.active.inc(pool, 1);
                st.active_bytes.inc(pool, size);
                st.requested_bytes.inc(pool, requested);
                if setup.is_oversize(size) {
                    st.oversize_allocations.inc(1);
                }
            }
            Note::Release { addr, size, requested, pool, stream, ctx, waiting } => {
                st.allocation.dec(pool, 1);
                st.allocated_bytes.dec(pool, size);
                st.requested_bytes.dec(pool, requested);
                if setup.is_oversize(size) {
                    st.oversize_allocations.dec(1);
                }
                if !a.free_logged {
                    let action = if waiting { Action::FreeRequested } else { Action::FreeCompleted };
                    a.recorder.event(action, addr, requested, stream.0, ctx);
                }
            }
            Note::WaitOver { addr, requested, stream } => {
                a.recorder.event(Action::FreeCompleted, addr, requested, stream.0, None);
            }
            Note::Deactivate { size, pool } => {
                st.active.dec(pool, 1);
                st.active_bytes.dec(pool, size);
            }
            Note::Strand { size, pool } => {
                st.active.inc(pool, 1);
                st.active_bytes.inc(pool, size);
            }
            Note::SplitFree { size, pool, counted: true } => {
                st.inactive_split.inc(pool, 1);
                st.inactive_split_bytes.inc(pool, size);
            }
            Note::SplitFree { size, pool, counted: false } => {
                st.inactive_split.dec(pool, 1);
                st.inactive_split_bytes.dec(pool, size);
            }
            Note::SegmentReserved { addr, size, pool, stream, .. } => {
                a.recorder.event(Action::SegmentAlloc, addr, size, stream.0, a.request_ctx);
                st.num_device_alloc += 1;
                st.segment.inc(pool, 1);
                st.reserved_bytes.inc(pool, size);
                if setup.is_oversize(size) {
                    st.oversize_segments.inc(1);
                }
            }
            Note::SegmentReleased { addr, size, mapped, pool, stream, .. } => {
                a.recorder.event(Action::SegmentFree, addr, size, stream.0, None);
                st.num_device_free += 1;
                st.segment.dec(pool, 1);
                st.reserved_bytes.dec(pool, mapped);
                if setup.is_oversize(size) {
                    st.oversize_segments.dec(1);
                }
            }
            Note::SegmentAdopted { addr, size, from, to, .. } => {
                a.recorder.event(Action::SegmentFree, addr, size, from.0, None);
                a.recorder.event(Action::SegmentAlloc, addr, size, to.0, a.request_ctx);
                st.num_segment_adoptions += 1;
            }
            Note::Pages { addr, len, pool, stream, mapped } => {
                if mapped {
                    a.recorder.event(Action::SegmentMap, addr, len, stream.0, a.request_ctx);
                    st.num_device_map += 1;
                    st.reserved_bytes.inc(pool, len);
                } else {
                    a.recorder.event(Action::SegmentUnmap, addr, len, stream.0, None);
                    st.num_device_unmap += 1;
                    st.reserved_bytes.dec(pool, len);
                }
            }
            // Counted with the page mappings (a call to the backend that maps); not in the
            // history, whose `segment_map` entries PyTorch's viewers add to reserved memory.
            Note::View { mapped: true } => st.num_device_map += 1,
            Note::View { mapped: false } => st.num_device_unmap += 1,
            Note::Oom { requested, device_free } => {
                st.num_ooms += 1;
                // PyTorch's `oom` entry: the address is the bytes the device still had free.
                a.recorder.event(Action::Oom, device_free, requested, 0, None);
            }
            Note::Retry => st.num_alloc_retries += 1,
            Note::SyncAllStreams => st.num_sync_all_streams += 1,
            Note::BackendError => st.num_backend_errors += 1,
            Note::LimitRaised => st.num_limit_raises += 1,
            Note::Snapshot => a.recorder.event(Action::Snapshot, 0, 0, 0, None),
        }
        // Which streams hold which segments: the streams' part keeps its own count.
        match n {
            Note::SegmentReserved { stream, pool, growable, .. } => {
                self.count_segment(stream, pool, growable, true);
                self.track_home(stream);
            }
            Note::SegmentReleased { stream, pool, growable, .. } => {
                self.count_segment(stream, pool, growable, false);
                self.track_home(stream);
            }
            Note::SegmentAdopted { from, to, pool, growable, .. } => {
                // Both counted before the home is decided again: it compares the streams.
                self.count_segment(from, pool, growable, false);
                self.count_segment(to, pool, growable, true);
                self.track_home(from);
                self.track_home(to);
            }
            _ => {}
        }
    }
}
