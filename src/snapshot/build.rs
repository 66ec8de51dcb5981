//! Building a [`Snapshot`] from an allocator: raw data copied under the lock, symbols resolved
//! after it is released.

use super::model::{
    BlockInfo, BlockState, ContextInfo, FrameId, HistoryEntry, ScopeId, SegmentInfo, Snapshot, StackId, ThreadId,
};
use crate::alloc::heap::{self, Heap};
use crate::alloc::CachingAllocator;
use crate::intern::Interner;
use crate::record::{scope_path, thread_name, Action, Context, Event, Frame, Symbolizer};

/// The version of the snapshot model written by this build.
///
/// 6 (2026-11-28): the history's `alloc`, `free_requested` and `free_completed` entries carry
/// the bytes asked for, as PyTorch's trace does (earlier versions recorded the block's size),
/// a block waiting for other streams keeps its `requested_size`, and a segment's
/// `requested_size` counts such blocks' requests too (PyTorch's counting).
/// 5 (2026-11-24): [`SegmentInfo::source`], [`Snapshot::driver_pool`]. 4 (2026-11-24): streams in 64 bits (PyTorch's stream handles whole),
/// [`SegmentInfo::expandable`], [`HistoryEntry::user_metadata`]. 3 (2026-11-23):
/// [`Snapshot::stack_capture`]. 2: [`Snapshot::time_origin_us`]. Every earlier
/// version still loads.
pub const SNAPSHOT_VERSION: u32 = 6;

/// The first version whose history records the bytes asked for (see [`SNAPSHOT_VERSION`]).
pub(crate) const HISTORY_REQUESTED_SINCE: u32 = 6;

struct Raw {
    device: usize,
    /// Each segment with the recorded context of each of its blocks, side by side: a block's
    /// context travels with it through the sort, never paired with it later by position.
    segments: Vec<(SegmentInfo, Vec<Option<Context>>)>,
    history: Vec<Event>,
    dropped: u64,
    stacks: Vec<Box<[usize]>>,
    sites: Vec<crate::record::Site>,
    stats: crate::alloc::MemoryStats,
    clock: crate::record::Clock,
    stacks_mode: crate::record::StackMode,
}

fn copy(heap: &Heap) -> Raw {
    let mut segments: Vec<(SegmentInfo, Vec<Option<Context>>)> = Vec::new();
    // The block kept aside by the last free and its free neighbours show as the one free block
    // that merging makes: a snapshot shows the heap as settled without settling it (see
    // `Heap::hot_merge`).
    let merge = heap.hot_merge();
    heap.for_each_block(|i, seg, b| {
        if segments.last().is_none_or(|(s, _)| s.address != seg.addr) {
            let info = SegmentInfo {
                address: seg.addr,
                total_size: seg.size,
                mapped_size: seg.mapped,
                expandable: seg.room > 0,
                stream: u64::from(seg.stream.0),
                device: None,
                pool: seg.pool,
                pool_id: None,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                blocks: Vec::new(),
                context: None,
                source: None,
            };
            segments.push((info, Vec::new()));
        }
        let (s, contexts) = segments.last_mut().expect("pushed above");
        let mut b = b;
        let mut merged = None;
        if let Some(m) = merge.filter(|m| [Some(m.hot), m.prev, m.next].contains(&Some(i))) {
            if i != m.prev.unwrap_or(m.hot) {
                return;
            }
            // The block that survives the merge (`merge_free` keeps the lower free neighbour,
            // else the upper one) carries the merged block's description.
            b = heap.block(m.prev.or(m.next).unwrap_or(m.hot));
            merged = Some(m);
        }
        let state = match b.state {
            heap::BlockState::Allocated => BlockState::ActiveAllocated,
            heap::BlockState::PendingFree | heap::BlockState::Stranded => BlockState::ActivePendingFree,
            heap::BlockState::Free => BlockState::Inactive,
        };
        let meta = b.extra.as_ref().and_then(|e| e.meta.as_ref());
        let (address, size, state) = match merged {
            Some(m) => (m.addr, m.size, BlockState::Inactive),
            None => (b.addr, b.size, state),
        };
        s.blocks.push(BlockInfo {
            address,
            size,
            requested_size: b.requested,
            state,
            dtype: meta.map(|m| m.dtype.clone()),
            shape: meta.map(|m| m.shape.clone()),
            context: None,
        });
        contexts.push(b.ctx);
    });
    segments.sort_by_key(|(s, _)| s.address);
    for (s, _) in &mut segments {
        let sum = s.summary();
        (s.allocated_size, s.active_size, s.requested_size) = (sum.allocated, sum.active, sum.active_requested);
    }
    let rec = heap.recorder();
    Raw {
        device: heap.device(),
        segments,
        history: rec.history.iter().copied().collect(),
        dropped: rec.history.total - rec.history.len() as u64,
        stacks: rec.stacks.stacks.clone(),
        sites: rec.sites.sites.clone(),
        stats: heap.settled_stats().public(),
        clock: rec.clock,
        stacks_mode: rec.config.stacks,
    }
}

struct FullContext {
    stack: Option<u32>,
    scope: u32,
    thread: u32,
    step: u64,
}

/// Interns frames, scopes and threads into the snapshot's tables.
#[derive(Default)]
struct Tables {
    frames: Interner<Frame>,
    /// By the recorder's stack id.
    stacks: Interner<u32, Vec<FrameId>>,
    /// By the recorder's scope id.
    scopes: Interner<u32, Vec<String>>,
    /// By the recorder's thread id.
    threads: Interner<u32, String>,
}

impl Tables {
    fn context(&mut self, c: Context, raw: &Raw, sym: &mut Symbolizer) -> ContextInfo {
        let site = raw.sites[c.site as usize];
        let c = FullContext { stack: site.stack, scope: site.scope, thread: site.thread, step: c.step };
        let raw = &raw.stacks[..];
        let stack = c.stack.map(|s| StackId(self.stack(s, raw, sym)));
        let scope = ScopeId(self.scopes.id(c.scope, |&s| scope_path(s)));
        let thread = ThreadId(self.threads.id(c.thread, |&t| thread_name(t)));
        ContextInfo { stack, scope, thread, step: c.step }
    }

    /// The index of `f` in the frame table, added if new.
    fn frame(&mut self, f: &Frame) -> FrameId {
        FrameId(self.frames.intern_ref(f))
    }

    fn stack(&mut self, id: u32, raw: &[Box<[usize]>], sym: &mut Symbolizer) -> u32 {
        if let Some(s) = self.stacks.get(&id) {
            return s;
        }
        let mut frames = Vec::new();
        let mut harness_seen = false;
        let ips = raw.get(id as usize).map(|b| &b[..]).unwrap_or(&[]);
        for &ip in ips {
            let (resolved, harness) = sym.resolve(ip);
            for f in resolved {
                frames.push(self.frame(f));
            }
            // The harness called the test body from here: the body's frames are complete. Where
            // none of them could be seen (a body inlined into the harness, in a build without
            // line tables), the user's test function outside the harness names it instead.
            harness_seen |= harness;
            if harness_seen && !frames.is_empty() {
                break;
            }
        }
        // Frames were captured but none is the program's own: its code was inlined into the
        // harness or the standard library (a build with symbols only), so say so rather than
        // show no stack.
        if !ips.is_empty() && frames.is_empty() {
            let function =
                if harness_seen { crate::record::INLINED_TEST_BODY } else { crate::record::INLINED_ELSEWHERE };
            frames.push(self.frame(&Frame { function: function.to_string(), file: None, line: None }));
        }
        self.stacks.id(id, |_| frames)
    }
}

impl CachingAllocator {
    /// A snapshot of segments, blocks with their state and context, and the history,
    /// symbolized. The lock is held only while the raw data is copied; symbols are resolved
    /// afterwards, each address once per allocator.
    ///
    /// ```
    /// use vramscope::{CachingAllocator, backend::HostBackend};
    /// let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
    /// let x = alloc.alloc::<f32>(&alloc.default_stream(), 256).unwrap();
    /// let snap = alloc.snapshot();
    /// assert_eq!(snap.live_blocks().count(), 1);
    /// let json = snap.to_json();
    /// # drop(x);
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let mut raw = {
            let mut locked = self.shared.read();
            locked.heap.recorder_mut().event(Action::Snapshot, 0, 0, 0, None);
            copy(&locked.heap)
        };
        let mut sym = self.shared.symbols.lock();
        let mut t = Tables::default();
        t.scopes.id(crate::record::ROOT_SCOPE, |_| Vec::new());
        let raw_segments = std::mem::take(&mut raw.segments);
        let mut segments = Vec::with_capacity(raw_segments.len());
        for (mut s, contexts) in raw_segments {
            for (b, c) in s.blocks.iter_mut().zip(contexts) {
                b.context = c.map(|c| t.context(c, &raw, &mut sym));
            }
            segments.push(s);
        }
        if self.backend().is_external() {
            // Memory the program allocated itself: marked, so that a report or a pickle of
            // this snapshot alone still says whose it is.
            let name = self.backend().name();
            segments.iter_mut().for_each(|s| s.source = Some(name.to_string()));
        }
        let to_ns = raw.clock.ticks_to_ns();
        let history = raw
            .history
            .iter()
            .map(|e| HistoryEntry {
                action: e.action(),
                addr: e.addr,
                size: e.size(),
                stream: u64::from(e.stream),
                device: None,
                time_ns: to_ns(e.ticks),
                context: e.context().map(|c| t.context(c, &raw, &mut sym)),
                compile_context: None,
                user_metadata: None,
            })
            .collect();
        Snapshot {
            version: SNAPSHOT_VERSION,
            device: raw.device,
            backend: self.backend().name().to_string(),
            segments,
            history,
            history_dropped: raw.dropped,
            frames: t.frames.into_items(),
            stacks: t.stacks.into_items(),
            scopes: t.scopes.into_items(),
            threads: t.threads.into_items(),
            stats: raw.stats,
            time_origin_us: raw.clock.origin_us(),
            allocator_settings: None,
            external_annotations: Vec::new(),
            stack_capture: Some(super::model::StackCapture::now(raw.stacks_mode)),
            driver_pool: self.backend().driver_pool(),
        }
    }
}
