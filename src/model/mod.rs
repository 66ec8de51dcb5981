//! The snapshot model: plain serde data of segments, blocks with their context, and the
//! history, with frames and stacks stored once in tables; the statistics it carries
//! ([`stats`]) and the ledger of the device's memory ([`ledger`]).
//!
//! It sits below the allocator, which builds it of its own state (for `snapshot()` and the
//! snapshot written at an out-of-memory error); `snapshot` reads and writes it in files, and
//! the reports read it.

pub(crate) mod ledger;
pub(crate) mod stats;

use crate::record::{Action, Frame, StackMode, Unwinder};
use serde::{Deserialize, Serialize};
use stats::{MemoryStats, Pool};

/// The version of the snapshot model written by this build.
///
/// 8: [`Snapshot::ledger`], the device's memory as the driver counts it and what holds it.
/// 7: a segment is one contiguous mapped range, as in PyTorch's snapshot of its
/// expandable segments: a virtual segment with pages unmapped under free holes is listed as
/// the ranges still mapped, a free block cut where its pages are unmapped (earlier versions
/// listed the whole address range, [`SegmentInfo::mapped_size`] the bytes of it mapped, and
/// PyTorch's viewers, reading it as mapped, drew unmapped memory as reserved).
/// 6: the history's `alloc`, `free_requested` and `free_completed` entries carry
/// the bytes asked for, as PyTorch's trace does (earlier versions recorded the block's size),
/// a block waiting for other streams keeps its `requested_size`, and a segment's
/// `requested_size` counts such blocks' requests too (PyTorch's counting).
/// 5: [`SegmentInfo::source`], [`Snapshot::driver_pool`]. 4: streams in 64 bits (PyTorch's
/// stream handles whole), [`SegmentInfo::expandable`], [`HistoryEntry::user_metadata`]. 3:
/// [`Snapshot::stack_capture`]. 2: [`Snapshot::time_origin_us`]. Every earlier
/// version still loads.
pub const SNAPSHOT_VERSION: u32 = 8;

/// The first version whose history records the bytes asked for (see [`SNAPSHOT_VERSION`]).
pub(crate) const HISTORY_REQUESTED_SINCE: u32 = 6;

/// The current-value statistics a PyTorch snapshot implies (it carries no counters).
pub(crate) fn stats_of(segments: &[SegmentInfo]) -> MemoryStats {
    let mut m = MemoryStats::default();
    for seg in segments {
        let s = seg.summary();
        let figures = [
            (&mut m.reserved_bytes, seg.total_size),
            (&mut m.allocated_bytes, s.allocated),
            (&mut m.active_bytes, s.active),
            (&mut m.requested_bytes, s.requested),
            (&mut m.segment, 1),
            (&mut m.allocation, s.allocated_blocks),
            (&mut m.active, s.active_blocks),
        ];
        for (stat, f) in figures {
            let pool = if seg.pool == Pool::Small { &mut stat.small_pool } else { &mut stat.large_pool };
            pool.current = pool.current.saturating_add(f);
            stat.all.current = stat.all.current.saturating_add(f);
        }
    }
    m
}

macro_rules! table_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// Serialized as the bare index, as format versions 1 to 4 wrote it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u32);

        /// As a `u32`; a slice of ids (a stack's frames, interned by their list) is hashed in
        /// one write per 64 ids, as `u32`'s own slices are, not one per id: a reader of
        /// PyTorch's default stacks (dozens of C++ frames each) hashed a stack per event.
        impl std::hash::Hash for $name {
            #[inline]
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.hash(state)
            }

            fn hash_slice<H: std::hash::Hasher>(data: &[Self], state: &mut H) {
                let mut buf = [0u8; 256];
                for chunk in data.chunks(64) {
                    for (b, id) in buf.chunks_exact_mut(4).zip(chunk) {
                        b.copy_from_slice(&id.0.to_ne_bytes());
                    }
                    state.write(&buf[..chunk.len() * 4]);
                }
            }
        }

        impl $name {
            /// Its index in the table.
            #[inline]
            pub const fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

table_id!(
    /// A frame: its index in [`Snapshot::frames`].
    FrameId
);
table_id!(
    /// A stack: its index in [`Snapshot::stacks`].
    StackId
);
table_id!(
    /// A scope path: its index in [`Snapshot::scopes`] (0: the root, no scope).
    ScopeId
);
table_id!(
    /// A thread: its index in [`Snapshot::threads`].
    ThreadId
);

impl ScopeId {
    /// The root: no scope.
    pub const ROOT: ScopeId = ScopeId(0);
}

/// Device indices a snapshot may name (PyTorch writes a trace list per device up to the
/// highest).
pub(crate) const MAX_DEVICES: usize = 1 << 16;

/// Everything an allocator knew at one moment, symbolized. Every report reads this, never the
/// allocator, so the same tools work on a snapshot loaded from disk.
///
/// A snapshot is consistent when it is handed out: [`CachingAllocator::snapshot`] builds one
/// from the heap, and every way of reading one ([`Snapshot::load`], [`Snapshot::from_bytes`],
/// [`Snapshot::from_pytorch_pickle`], and serde's `Deserialize`, e.g. `serde_json::from_str`)
/// checks it with [`Snapshot::validate`] and refuses an inconsistent one. It cannot be built
/// field by field outside this crate; a program that edits the fields of one takes over that
/// duty (the reports never panic on a broken one, but may skip what they cannot place).
///
/// [`CachingAllocator::snapshot`]: crate::CachingAllocator::snapshot
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// The derived code becomes `Snapshot::serialize` and `Snapshot::deserialize`, which the trait
// impls below call, the latter followed by validation.
#[serde(remote = "Self")]
#[non_exhaustive]
pub struct Snapshot {
    /// Format version of this model.
    pub version: u32,
    /// Device index.
    pub device: usize,
    /// Backend name.
    pub backend: String,
    /// Segments in address order, with their blocks.
    pub segments: Vec<SegmentInfo>,
    /// The recorded history, oldest first.
    pub history: Vec<HistoryEntry>,
    /// History entries recorded but no longer in the ring buffer.
    pub history_dropped: u64,
    /// Source frames, each stored once.
    pub frames: Vec<Frame>,
    /// Stacks as ids of `frames`, innermost first, vramscope's and std's frames trimmed.
    pub stacks: Vec<Vec<FrameId>>,
    /// Scope paths, outermost first; index 0 is the root (no scope).
    pub scopes: Vec<Vec<String>>,
    /// Thread names.
    pub threads: Vec<String>,
    /// The allocator's statistics (a file holds them as PyTorch's flat map, with its key
    /// names). A PyTorch snapshot has none: its current figures are worked out from its
    /// segments, the others are 0.
    #[serde(with = "stats::flat_map")]
    pub stats: MemoryStats,
    /// Microseconds since the Unix epoch at which the history's `time_ns` count from: when
    /// recording started, or PyTorch's first event. 0 where unknown (format version 1).
    #[serde(default)]
    pub time_origin_us: u64,
    /// PyTorch's `allocator_settings`, as read from its snapshot (kept to be written back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_settings: Option<serde_json::Value>,
    /// PyTorch's `external_annotations` (profiler ranges with their times), kept as read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_annotations: Vec<serde_json::Value>,
    /// How the recording took its stacks (format version 3 on; absent in earlier snapshots
    /// and in PyTorch's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_capture: Option<StackCapture>,
    /// What the device's stream-ordered pool (CUDA's `cuMemAllocAsync` pool, which cudarc and
    /// candle allocate from) held when the snapshot was taken, where the backend can tell
    /// (format version 5 on; the CUDA backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_pool: Option<crate::backend::DriverPool>,
    /// The device's memory as the driver counts it and what holds it, where the snapshot was
    /// taken with it (format version 8 on; [`vramscope::ledger`](crate::ledger)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<ledger::Ledger>,
}

impl Serialize for Snapshot {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Snapshot::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for Snapshot {
    /// Reads the fields, then refuses an inconsistent snapshot ([`Snapshot::validate`]).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Snapshot, D::Error> {
        let snap = Snapshot::deserialize_unchecked(d)?;
        snap.validate().map_err(serde::de::Error::custom)?;
        Ok(snap)
    }
}

impl Snapshot {
    /// The fields as read, before validation: for readers that check the version first.
    pub(crate) fn deserialize_unchecked<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Snapshot, D::Error> {
        Snapshot::deserialize(d)
    }
}

/// How a recording took its stacks: what a reader needs to trust them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StackCapture {
    /// The allocator's [`RecordConfig::stacks`](crate::record::RecordConfig::stacks).
    pub mode: StackMode,
    /// The unwinder that mode uses in the process that took the snapshot.
    pub unwinder: Unwinder,
    /// Stacks of the fast mode that the `backtrace` crate's unwinder took instead (frames the
    /// cached unwinder does not model), in that process so far
    /// ([`fast_fallbacks`](crate::record::fast_fallbacks)).
    pub fallbacks: u64,
}

impl StackCapture {
    /// The capture of `mode` in this process now.
    pub(crate) fn now(mode: StackMode) -> StackCapture {
        let unwinder = match mode {
            StackMode::Off => Unwinder::None,
            StackMode::Full => Unwinder::Backtrace,
            _ => crate::record::fast_unwinder(),
        };
        StackCapture { mode, unwinder, fallbacks: crate::record::fast_fallbacks() }
    }
}

/// One segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SegmentInfo {
    /// Base address.
    pub address: u64,
    /// Size of the segment's address range. Since format 7 a segment is one contiguous mapped
    /// range (as in PyTorch's snapshot of its expandable segments): a virtual segment with
    /// pages unmapped under free holes is listed as the ranges still mapped, so that the
    /// segments' sizes sum to the bytes reserved.
    pub total_size: u64,
    /// Bytes of it mapped: `total_size` since format 7; in earlier files, less where pages
    /// under free holes were unmapped.
    pub mapped_size: u64,
    /// Whether the segment can grow in place or lies in memory mapped in pieces (PyTorch's
    /// `is_expandable`: kept as read; in vramscope's, a segment with addresses reserved after
    /// its end, see [`Backend::reserve_growable`](crate::backend::Backend::reserve_growable),
    /// or a mapped range of a segment with pages unmapped).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expandable: bool,
    /// The stream: vramscope's allocator-local index, or the CUDA stream handle a PyTorch
    /// snapshot names (a pointer, kept whole).
    pub stream: u64,
    /// The device, in a snapshot of several ([`Snapshot::devices`]); `None`: the snapshot's
    /// [`device`](Snapshot::device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<usize>,
    /// The pool (`small` or `large` in JSON and pickles).
    pub pool: Pool,
    /// PyTorch's `segment_pool_id` where it is not `(0, 0)`: the private pool of a CUDA graph
    /// or a `torch.cuda.MemPool` the segment belongs to, kept as read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_id: Option<(u64, u64)>,
    /// Bytes in allocated blocks.
    pub allocated_size: u64,
    /// Bytes in allocated or pending-free blocks.
    pub active_size: u64,
    /// Bytes the callers of the active blocks (allocated, or waiting for another stream) asked
    /// for, as PyTorch's snapshot counts them.
    pub requested_size: u64,
    /// Blocks in address order.
    pub blocks: Vec<BlockInfo>,
    /// Who made the segment, where known (PyTorch records the stack that reserved it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextInfo>,
    /// Whose segment it is: the backend of the allocator that held it, set for memory the
    /// program allocated itself (`cuda (observed)`: CUDA allocations seen by
    /// `vramscope::observe`; an allocator made by `CachingAllocator::external`) and, in a
    /// snapshot merged from several allocators (a memory test's evidence), for every segment
    /// not of the first allocator's backend; `None`: the snapshot's
    /// [`backend`](Snapshot::backend). PyTorch pickles carry it as the segment's `source` key
    /// (which PyTorch's tools ignore).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// What a segment's blocks add up to ([`SegmentInfo::summary`]), sums saturating at
/// `u64::MAX` (a hostile file may claim any sizes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SegmentSummary {
    /// Bytes of allocated blocks (rounded sizes).
    pub allocated: u64,
    /// Bytes of allocated blocks and of those waiting for another stream.
    pub active: u64,
    /// Bytes the allocated blocks' callers asked for.
    pub requested: u64,
    /// Bytes the active blocks' callers asked for (allocated and waiting): PyTorch's segment
    /// `requested_size`.
    pub active_requested: u64,
    /// Rounding waste of the allocated blocks: `allocated - requested`, block by block.
    pub waste: u64,
    /// Bytes of free blocks.
    pub free: u64,
    /// The largest free block.
    pub largest_free: u64,
    /// Allocated blocks.
    pub allocated_blocks: u64,
    /// Allocated and waiting blocks.
    pub active_blocks: u64,
}

impl SegmentInfo {
    /// Sums over the segment's blocks: the one place they are computed (the snapshot's own
    /// `allocated_size`, `active_size` and `requested_size`, the statistics a PyTorch snapshot
    /// implies, and the `segments` report all come from here).
    pub fn summary(&self) -> SegmentSummary {
        let mut s = SegmentSummary::default();
        for b in &self.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    s.allocated = s.allocated.saturating_add(b.size);
                    s.requested = s.requested.saturating_add(b.requested_size);
                    s.waste = s.waste.saturating_add(b.size.saturating_sub(b.requested_size));
                    s.allocated_blocks += 1;
                }
                BlockState::ActivePendingFree => {}
                BlockState::Inactive => {
                    s.free = s.free.saturating_add(b.size);
                    s.largest_free = s.largest_free.max(b.size);
                    continue;
                }
            }
            s.active = s.active.saturating_add(b.size);
            s.active_requested = s.active_requested.saturating_add(b.requested_size);
            s.active_blocks += 1;
        }
        s
    }
}

/// The state of a block, with PyTorch's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to a live buffer.
    ActiveAllocated,
    /// Dropped, waiting for other streams.
    ActivePendingFree,
    /// Free, cached.
    Inactive,
}

/// One block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BlockInfo {
    /// Address.
    pub address: u64,
    /// Block size.
    pub size: u64,
    /// Bytes requested (0 when free).
    pub requested_size: u64,
    /// State.
    pub state: BlockState,
    /// Element type, where the buffer was described as a tensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Shape, where the buffer was described as a tensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<usize>>,
    /// Who allocated it, where recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextInfo>,
}

/// Who made an allocation (or a free), doing what, when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ContextInfo {
    /// The stack, where one was captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<StackId>,
    /// The scope path.
    pub scope: ScopeId,
    /// The thread.
    pub thread: ThreadId,
    /// The step marker at the time.
    pub step: u64,
}

/// One history event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HistoryEntry {
    /// What happened.
    pub action: Action,
    /// Block or segment address; for [`Action::Oom`], the bytes the device still had free
    /// (PyTorch's `device_free`).
    pub addr: u64,
    /// Bytes: of a block event (`alloc`, `free_requested`, `free_completed`), those asked for,
    /// as in PyTorch's trace (vramscope files before format 6 recorded the block's size); of
    /// a segment event, the segment's or the pages'; of an `oom`, the request.
    pub size: u64,
    /// The stream, as [`SegmentInfo::stream`].
    pub stream: u64,
    /// The device, as [`SegmentInfo::device`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<usize>,
    /// Nanoseconds since [`Snapshot::time_origin_us`].
    pub time_ns: u64,
    /// Who, where recorded for this action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextInfo>,
    /// PyTorch's `compile_context` of the event (`N/A` outside `torch.compile`), kept as read.
    /// (Boxed, as `user_metadata`: a history of millions of entries holds few of either.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_context: Option<Box<str>>,
    /// PyTorch's `user_metadata` of the event where it is not a string (a string is a scope
    /// path, in `context`), kept as read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_metadata: Option<Box<serde_json::Value>>,
}

/// The `backend` of a snapshot read from PyTorch's pickle format.
pub(crate) const PYTORCH_BACKEND: &str = "pytorch";

impl Snapshot {
    /// Whether the snapshot was read from PyTorch's pickle format (not recorded by vramscope).
    pub(crate) fn is_from_pytorch(&self) -> bool {
        self.backend == PYTORCH_BACKEND
    }

    /// A snapshot with nothing in it.
    pub(crate) fn empty(backend: &str) -> Snapshot {
        Snapshot {
            version: SNAPSHOT_VERSION,
            device: 0,
            backend: backend.to_string(),
            segments: Vec::new(),
            history: Vec::new(),
            history_dropped: 0,
            frames: Vec::new(),
            stacks: Vec::new(),
            scopes: vec![Vec::new()],
            threads: Vec::new(),
            stats: MemoryStats::default(),
            time_origin_us: 0,
            allocator_settings: None,
            external_annotations: Vec::new(),
            stack_capture: None,
            driver_pool: None,
            ledger: None,
        }
    }

    /// The scope path of a context as reports and PyTorch's `user_metadata` write it: the
    /// names joined by `/`, empty for the root or no context.
    pub(crate) fn scope_path(&self, ctx: Option<&ContextInfo>) -> String {
        ctx.and_then(|c| self.scope(c.scope)).map(|p| p.join("/")).unwrap_or_default()
    }

    /// The frames of `stack`, innermost first (none for an id outside the table).
    pub fn stack_frames(&self, stack: StackId) -> impl Iterator<Item = &Frame> + Clone {
        self.stacks.get(stack.index()).into_iter().flatten().filter_map(|&f| self.frame(f))
    }

    /// A frame of the table.
    pub fn frame(&self, id: FrameId) -> Option<&Frame> {
        self.frames.get(id.index())
    }

    /// A scope path of the table, outermost first.
    pub fn scope(&self, id: ScopeId) -> Option<&[String]> {
        self.scopes.get(id.index()).map(Vec::as_slice)
    }

    /// A thread's name.
    pub fn thread(&self, id: ThreadId) -> Option<&str> {
        self.threads.get(id.index()).map(String::as_str)
    }

    /// The devices the snapshot holds, in order: one for vramscope's snapshots, each GPU's
    /// for a PyTorch snapshot of several.
    pub fn devices(&self) -> Vec<usize> {
        let segments = self.segments.iter().map(|s| s.device);
        let events = self.history.iter().map(|e| e.device);
        // A history of millions of entries names a few devices, mostly the one named last: no
        // list of every entry's device is made.
        let mut seen = std::collections::BTreeSet::new();
        let mut last = None;
        for d in segments.chain(events).map(|d| d.unwrap_or(self.device)) {
            if last != Some(d) {
                seen.insert(d);
                last = Some(d);
            }
        }
        if seen.is_empty() {
            seen.insert(self.device);
        }
        seen.into_iter().collect()
    }

    /// The part of the snapshot on `device`: its segments and history, as a snapshot of that
    /// device alone (with copies of the frame, stack and scope tables). Every report reads one
    /// device: the command line runs each report once per device of a snapshot of several.
    pub fn for_device(&self, device: usize) -> Snapshot {
        self.by_devices(&[device]).pop().expect("one snapshot per device asked for")
    }

    /// The parts of the snapshot on each of `devices` ([`Snapshot::for_device`] of each), made in
    /// one pass over the segments and history; parts on other devices are left out. Each part
    /// holds the frames, stacks, scopes and threads its own blocks and events name, not the
    /// whole snapshot's tables.
    pub fn by_devices(&self, devices: &[usize]) -> Vec<Snapshot> {
        self.split(devices, u64::MAX).unwrap_or_default()
    }

    /// [`Snapshot::by_devices`], refused where the parts would copy the snapshot's tables many
    /// times over: more frames and stack entries in all than 16 times the snapshot's own
    /// frames, stack entries, blocks and events, plus 4 million. A file whose thousands of
    /// devices each name one long shared stack is refused in one line rather than taking
    /// gigabytes; a real snapshot of a few GPUs, each naming most of the stacks, splits.
    pub fn try_by_devices(&self, devices: &[usize]) -> crate::error::Result<Vec<Snapshot>> {
        let whole = self.frames.len() as u64
            + self.stacks.iter().map(|s| s.len() as u64).sum::<u64>()
            + self.history.len() as u64
            + self.segments.iter().map(|s| s.blocks.len() as u64).sum::<u64>();
        self.split(devices, whole.saturating_mul(16).saturating_add(4_000_000))
            .map_err(|message| crate::error::Error::Format { source_name: "the snapshot".into(), message })
    }

    /// [`Snapshot::by_devices`], refused (with why) where the parts' tables would hold more
    /// than `most` frames and stack entries in all: tables shared by many devices are copied
    /// into each part.
    pub(crate) fn split(&self, devices: &[usize], most: u64) -> Result<Vec<Snapshot>, String> {
        let slot: std::collections::HashMap<usize, usize> = devices.iter().enumerate().map(|(i, &d)| (d, i)).collect();
        let mut segments: Vec<Vec<SegmentInfo>> = vec![Vec::new(); devices.len()];
        let mut history: Vec<Vec<HistoryEntry>> = vec![Vec::new(); devices.len()];
        for s in &self.segments {
            if let Some(&i) = slot.get(&s.device.unwrap_or(self.device)) {
                segments[i].push(SegmentInfo { device: None, ..s.clone() });
            }
        }
        for e in &self.history {
            if let Some(&i) = slot.get(&e.device.unwrap_or(self.device)) {
                history[i].push(HistoryEntry { device: None, ..e.clone() });
            }
        }
        // What each part's tables will hold, counted before any is made.
        let mut copied = 0u64;
        let mut tables = Vec::with_capacity(devices.len());
        for (segments, history) in segments.iter_mut().zip(history.iter_mut()) {
            let contexts = segments
                .iter_mut()
                .flat_map(|s| s.blocks.iter_mut().filter_map(|b| b.context.as_mut()))
                .chain(history.iter_mut().filter_map(|e| e.context.as_mut()));
            let t = PartTables::of(self, contexts);
            copied = copied.saturating_add(t.size);
            if copied > most {
                return Err(format!(
                    "splitting it by its {} devices would copy {copied} frames and stack entries or more, \
                     past {most}: the devices share tables far larger than each device's part",
                    devices.len()
                ));
            }
            tables.push(t);
        }
        // The statistics of a snapshot of several devices add them all: each part's are its own.
        let several = self.devices().len() > 1;
        Ok(devices
            .iter()
            .zip(segments.into_iter().zip(history).zip(tables))
            .map(|(&device, ((segments, history), t))| Snapshot {
                version: self.version,
                device,
                backend: self.backend.clone(),
                stats: if several { stats_of(&segments) } else { self.stats.clone() },
                segments,
                history,
                history_dropped: self.history_dropped,
                frames: t.frames.iter().map(|f| self.frames[f.index()].clone()).collect(),
                stacks: t.stacks,
                scopes: t.scopes.iter().map(|s| self.scopes[s.index()].clone()).collect(),
                threads: t.threads.iter().map(|t| self.threads[t.index()].clone()).collect(),
                time_origin_us: self.time_origin_us,
                allocator_settings: self.allocator_settings.clone(),
                external_annotations: self.external_annotations.clone(),
                stack_capture: self.stack_capture,
                driver_pool: self.driver_pool,
                ledger: self.ledger.clone().filter(|l| l.device == device),
            })
            .collect())
    }

    /// Live (allocated) blocks with their segment.
    pub fn live_blocks(&self) -> impl Iterator<Item = &BlockInfo> {
        self.segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::ActiveAllocated)
    }

    /// The snapshot as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a snapshot always serializes")
    }
}

/// The tables of one device's part: the whole snapshot's frames, scopes and threads it names
/// (their ids in the whole), and its stacks in the part's frame ids. Making it renumbers the
/// part's contexts.
struct PartTables {
    frames: Vec<FrameId>,
    stacks: Vec<Vec<FrameId>>,
    scopes: Vec<ScopeId>,
    threads: Vec<ThreadId>,
    /// Frames and stack entries in all.
    size: u64,
}

impl PartTables {
    fn of<'a>(whole: &Snapshot, contexts: impl Iterator<Item = &'a mut ContextInfo>) -> PartTables {
        use std::collections::HashMap;
        let mut t = PartTables {
            frames: Vec::new(),
            stacks: Vec::new(),
            scopes: vec![ScopeId::ROOT],
            threads: Vec::new(),
            size: 0,
        };
        let (mut frame_of, mut stack_of) = (HashMap::new(), HashMap::new());
        let (mut scope_of, mut thread_of) = (HashMap::from([(ScopeId::ROOT, ScopeId::ROOT)]), HashMap::new());
        for c in contexts {
            if let Some(stack) = c.stack {
                let new = *stack_of.entry(stack).or_insert_with(|| {
                    let frames: Vec<FrameId> = whole
                        .stacks
                        .get(stack.index())
                        .map_or(&[][..], Vec::as_slice)
                        .iter()
                        .map(|&f| {
                            *frame_of.entry(f).or_insert_with(|| {
                                t.frames.push(f);
                                FrameId(t.frames.len() as u32 - 1)
                            })
                        })
                        .collect();
                    t.size += frames.len() as u64;
                    t.stacks.push(frames);
                    StackId(t.stacks.len() as u32 - 1)
                });
                c.stack = Some(new);
            }
            c.scope = *scope_of.entry(c.scope).or_insert_with(|| {
                t.scopes.push(c.scope);
                ScopeId(t.scopes.len() as u32 - 1)
            });
            c.thread = *thread_of.entry(c.thread).or_insert_with(|| {
                t.threads.push(c.thread);
                ThreadId(t.threads.len() as u32 - 1)
            });
        }
        t.size += t.frames.len() as u64;
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PyTorch history holds millions of entries: each byte here is megabytes there.
    #[test]
    fn a_history_entry_takes_104_bytes() {
        assert_eq!(std::mem::size_of::<HistoryEntry>(), 104);
    }
}
