//! Recording: who made each allocation, doing what, when.
//!
//! Every allocation can remember a stack (raw instruction pointers, interned), the scope path
//! (from [`scope`] guards), the thread and the step ([`step`]); a bounded ring buffer keeps the
//! allocator's event history. Symbols are resolved only when a snapshot asks.
//!
//! What is recorded is a [`RecordConfig`], changed at run time with
//! [`CachingAllocator::record_memory_history`](crate::CachingAllocator::record_memory_history) (like `torch.cuda.memory._record_memory_history`):
//! stacks [`StackMode::Fast`] (the default), [`StackMode::Full`] or off, a depth limit, scopes,
//! the history's size and which events carry context ([`ContextLevel`]).
//!
//! Stacks are return addresses captured at one `#[inline(never)]` site, each distinct stack
//! stored once per allocator, and resolved to file, line and function only when a snapshot is
//! taken, each address once. They need no build flags. On x86-64 Linux the fast mode
//! ([`fast_unwinder`] says which unwinder a process uses) reads the unwind tables that every
//! object carries for panics and C++ exceptions (`.eh_frame`), found through
//! `dl_iterate_phdr`, so it is exact without frame pointers and through C and C++ libraries
//! (libcuda, libcupti) that have none; the rule at each return address is read once per thread
//! and cached, and an allocation from a place the thread allocated from before only checks
//! that the stack slots the last walk read still hold the same values (the frame pointer
//! register and the slots it was saved to only where some frame's rule used them: without
//! frame pointers it is an ordinary register, holding anything). In a release build
//! without frame pointers a recorded pair costs about twice an unrecorded one, where the
//! `backtrace` crate's unwinder ([`StackMode::Full`]) costs 60 times (BENCHMARKS.md). Libraries loaded later (`dlopen`) are found at their first frame; frames
//! the cached unwinder does not model (signal handlers, code generated at run time) are taken
//! by the `backtrace` crate's unwinder, counted by [`fast_fallbacks`]. Every read is checked
//! against the thread's stack bounds. A snapshot records which unwinder took its stacks
//! ([`Snapshot::stack_capture`](crate::Snapshot::stack_capture)). Elsewhere (aarch64, macOS, Windows) the fast mode walks
//! frame pointers where a once-per-process check ([`frame_pointers_available`]) finds them
//! complete, and uses the `backtrace` crate's unwinder otherwise.
//!
//! Scopes are per thread: [`scope`] guards nest, [`current_scope`] and [`Scope::enter`] carry a
//! scope into a thread you spawn, [`Scope::wrap`] into an async task (a guard is tied to its
//! thread and cannot be held across an `.await` in a `Send` future), and with the cargo
//! feature `tracing`, `ScopeLayer` turns entered `tracing` spans into scopes, restoring them
//! by span when spans exit out of order.

mod frame;
mod hash;
mod history;
mod scope;
mod stack;
#[cfg(feature = "tracing")]
mod tracing_layer;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod unwind;

pub use frame::Frame;
pub use history::Action;
pub use scope::{current_scope, current_step, scope, step, Scope, ScopeGuard, Scoped};
pub use stack::{capture_stack, fast_fallbacks, fast_unwinder, frame_pointers_available, StackMode, Unwinder};
#[cfg(feature = "tracing")]
pub use tracing_layer::ScopeLayer;

#[cfg(test)]
use hash::hash_stack;
pub(crate) use history::{Context, Event, Ring, Site};
pub(crate) use scope::{is_within, snapshot_path, thread_id, thread_name, ROOT as ROOT_SCOPE};
pub use scope::{KEPT_INNER, KEPT_OUTER, MAX_SCOPE_DEPTH};
pub(crate) use stack::capture;

use serde::{Deserialize, Serialize};
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

/// Which events carry their context (stack, scope, thread, step) in the history, as PyTorch's
/// `context` argument of `_record_memory_history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContextLevel {
    /// No context on events (blocks still carry theirs).
    None,
    /// Context on allocations, and on the segments reserved and pages mapped to serve them
    /// (`segment_alloc`, `segment_map`: the allocation's context, as PyTorch records them).
    #[default]
    Alloc,
    /// Context on allocations and frees (a free records who dropped the buffer).
    All,
}

/// What an allocator records. Change it at run time with
/// [`CachingAllocator::record_memory_history`](crate::CachingAllocator::record_memory_history).
///
/// ```
/// use vramscope::{CachingAllocator, record::RecordConfig, backend::SimBackend, record::StackMode};
/// let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
/// let mut rec = RecordConfig::default();
/// rec.stacks = StackMode::Full;
/// rec.max_entries = 1000;
/// alloc.record_memory_history(rec);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RecordConfig {
    /// Stack capture per allocation. Default: [`StackMode::Fast`]: on x86-64 Linux the cached
    /// unwinder over the loaded objects' unwind tables (exact in any build, no frame pointers
    /// needed; a few nanoseconds a frame, a compare a frame where the thread allocated from
    /// the same place before); elsewhere frame pointers where they are complete, else the
    /// `backtrace` crate's unwinder. [`fast_unwinder`] says which this process uses, and a
    /// snapshot records it ([`Snapshot::stack_capture`](crate::Snapshot::stack_capture)).
    /// [`StackMode::Full`] always uses the `backtrace` crate's unwinder (microseconds a stack).
    pub stacks: StackMode,
    /// Most frames kept per stack (vramscope's own frames included), at most
    /// [`MAX_STACK_DEPTH`]. Default: 32.
    pub max_depth: usize,
    /// Record the scope path of each allocation. Default: `true`.
    pub scopes: bool,
    /// History entries kept; `0` turns the history off. Default: 100,000.
    pub max_entries: usize,
    /// Which history events carry their context. Default: [`ContextLevel::Alloc`].
    pub context: ContextLevel,
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            stacks: StackMode::Fast,
            max_depth: 32,
            scopes: true,
            max_entries: 100_000,
            context: ContextLevel::Alloc,
        }
    }
}

impl RecordConfig {
    /// Records nothing: no stacks, no scopes, no history.
    pub fn off() -> Self {
        RecordConfig {
            stacks: StackMode::Off,
            scopes: false,
            max_entries: 0,
            context: ContextLevel::None,
            ..Self::default()
        }
    }

    /// Whether allocations need a context at all.
    pub(crate) fn wants_context(&self) -> bool {
        self.stacks != StackMode::Off || self.scopes || self.max_entries > 0
    }
}

/// A hasher for keys that are hashes already.
#[derive(Default)]
pub(crate) struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Every distinct stack, stored once.
#[derive(Default)]
pub(crate) struct StackTable {
    /// First stack with each hash; further ones chain through `next`.
    by_hash: HashMap<u64, u32, BuildHasherDefault<IdentityHasher>>,
    /// The next stack of the same hash, if any.
    next: Vec<Option<u32>>,
    pub(crate) stacks: Vec<Box<[usize]>>,
}

impl StackTable {
    #[cfg(test)]
    pub(crate) fn intern(&mut self, ips: &[usize]) -> u32 {
        self.intern_hashed(ips, hash_stack(ips))
    }

    /// Interns `ips`, whose [`hash_stack`](hash::hash_stack) is `h`.
    #[inline]
    pub(crate) fn intern_hashed(&mut self, ips: &[usize], h: u64) -> u32 {
        let id = self.stacks.len() as u32;
        match self.by_hash.entry(h) {
            std::collections::hash_map::Entry::Occupied(first) => {
                let mut i = *first.get();
                loop {
                    if *self.stacks[i as usize] == *ips {
                        return i;
                    }
                    match self.next[i as usize] {
                        Some(next) => i = next,
                        None => {
                            self.next[i as usize] = Some(id);
                            break;
                        }
                    }
                }
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(id);
            }
        }
        self.stacks.push(ips.into());
        self.next.push(None);
        id
    }

    pub(crate) fn len(&self) -> usize {
        self.stacks.len()
    }
}

/// Every distinct site (stack, scope, thread), stored once.
#[derive(Default)]
pub(crate) struct SiteTable {
    ids: HashMap<Site, u32, BuildHasherDefault<SiteHasher>>,
    pub(crate) sites: Vec<Site>,
}

impl SiteTable {
    #[inline]
    fn intern(&mut self, site: Site) -> u32 {
        let next = self.sites.len() as u32;
        let id = *self.ids.entry(site).or_insert(next);
        if id == next {
            self.sites.push(site);
        }
        id
    }
}

/// Hashes the three words of a [`Site`].
#[derive(Default)]
pub(crate) struct SiteHasher(u64);

impl Hasher for SiteHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.0 = hash::mix(self.0, n as usize);
    }
}

/// An allocator's recording state, kept under its lock.
pub(crate) struct Recorder {
    pub(crate) config: RecordConfig,
    pub(crate) stacks: StackTable,
    pub(crate) sites: SiteTable,
    pub(crate) history: Ring,
    pub(crate) clock: Clock,
    /// Per thread (by id, [`LAST_SITES`] slots, allocated at first use), the site its last
    /// capture was interned as (see [`Pending::intern`]).
    last_site: Vec<LastSite>,
}

/// Slots of [`Recorder::last_site`]: threads whose ids differ by a multiple share one.
const LAST_SITES: usize = 256;

/// What a thread's last interned capture was: its unwinder trace version, length and scope,
/// and the site it became.
#[derive(Debug, Clone, Copy, Default)]
struct LastSite {
    thread: u32,
    /// 0: none (trace versions start at 1).
    version: u64,
    len: usize,
    scope: u32,
    site: u32,
}

/// A cheap timestamp: the CPU's time-stamp counter where there is one (a few nanoseconds to
/// read, where `Instant::now` costs 30 ns or more on virtual machines), converted to
/// nanoseconds against `Instant` when a snapshot is taken.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: Instant,
    start_ticks: u64,
    /// Microseconds since the Unix epoch at `start` (0 if the system clock is before it).
    origin_us: u64,
}

impl Clock {
    pub(crate) fn new() -> Self {
        let origin_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        Clock { start: Instant::now(), start_ticks: ticks(), origin_us }
    }

    /// Microseconds since the Unix epoch when the clock started.
    pub(crate) fn origin_us(&self) -> u64 {
        self.origin_us
    }

    /// Raw ticks since the clock started.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.since_start(ticks())
    }

    /// Ticks since the clock started at the raw reading `raw` (of [`raw_ticks`]).
    #[inline]
    pub(crate) fn since_start(&self, raw: u64) -> u64 {
        raw.wrapping_sub(self.start_ticks)
    }

    /// A function from ticks to nanoseconds since the start, calibrated now.
    pub(crate) fn ticks_to_ns(self) -> impl Fn(u64) -> u64 {
        let ns = self.start.elapsed().as_nanos() as f64;
        let t = self.now() as f64;
        let scale = if TICKS_ARE_NANOS || t <= 0.0 { 1.0 } else { ns / t };
        move |ticks| (ticks as f64 * scale) as u64
    }
}

/// A raw reading of the clock every recorder shares, for events a thread logs without the
/// allocator's lock (see `Clock::since_start`).
#[inline]
pub(crate) fn raw_ticks() -> u64 {
    ticks()
}

#[cfg(target_arch = "x86_64")]
const TICKS_ARE_NANOS: bool = false;
#[cfg(not(target_arch = "x86_64"))]
const TICKS_ARE_NANOS: bool = true;

#[cfg(target_arch = "x86_64")]
#[inline]
fn ticks() -> u64 {
    // SAFETY: `rdtsc` exists on every x86-64 processor and has no preconditions.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn ticks() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("config", &self.config).field("stacks", &self.stacks.len()).finish()
    }
}

impl Recorder {
    pub(crate) fn new(config: RecordConfig) -> Self {
        let history = Ring::new(config.max_entries);
        Recorder {
            config,
            stacks: StackTable::default(),
            sites: SiteTable::default(),
            history,
            clock: Clock::new(),
            last_site: Vec::new(),
        }
    }

    pub(crate) fn set_config(&mut self, config: RecordConfig) {
        self.history.set_capacity(config.max_entries);
        self.config = config;
    }

    /// Records an event, with `context` if the configuration keeps context on this action.
    #[inline]
    pub(crate) fn event(&mut self, action: Action, addr: u64, size: u64, stream: u32, context: Option<Context>) {
        if self.config.max_entries == 0 {
            return;
        }
        self.event_at(action, addr, size, stream, context, ticks());
    }

    /// Records an event that happened at the raw clock reading `raw` (a thread logged it: see
    /// `alloc::park`), with `ctx` if the configuration keeps context on this action.
    #[inline]
    pub(crate) fn event_at(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        stream: u32,
        ctx: Option<Context>,
        raw: u64,
    ) {
        if self.config.max_entries == 0 {
            return;
        }
        let keep = match self.config.context {
            ContextLevel::None => false,
            ContextLevel::Alloc => matches!(action, Action::Alloc | Action::SegmentAlloc | Action::SegmentMap),
            ContextLevel::All => true,
        };
        let ticks = self.clock.since_start(raw);
        self.history.push(Event::new(action, addr, size, stream, ticks, if keep { ctx } else { None }));
    }
}

/// The most frames a stack keeps.
pub const MAX_STACK_DEPTH: usize = 128;

struct Scratch {
    ips: [usize; MAX_STACK_DEPTH],
    len: usize,
}

thread_local! {
    /// Where a capture puts its frames until they are interned under the allocator's lock.
    static SCRATCH: UnsafeCell<Scratch> = const { UnsafeCell::new(Scratch { ips: [0; MAX_STACK_DEPTH], len: 0 }) };
}

/// Runs `f` on this thread's scratch stack.
#[inline]
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    // SAFETY: the scratch is thread-local and only this function hands out references to it,
    // for the duration of `f`; `f` (a capture or an intern) never calls back into it, so the
    // reference is unique.
    SCRATCH.with(|s| f(unsafe { &mut *s.get() }))
}

/// What the calling thread is doing, captured before the allocator's lock is taken: the raw
/// stack stays in a per-thread buffer until [`Pending::intern`] stores it.
pub(crate) struct Pending {
    pub(crate) scope: u32,
    /// The scope's allocation counter (none at the root or without scopes).
    counter: Option<&'static scope::Count>,
    pub(crate) thread: u32,
    pub(crate) step: u64,
    has_stack: bool,
    hash: u64,
    /// The unwinder's trace version and the stack's length, where the cached unwinder took it.
    version: Option<(u64, usize)>,
}

/// What to capture per allocation, readable without the allocator's lock.
#[derive(Debug, Default)]
pub(crate) struct CaptureFlags(AtomicU32);

#[derive(Debug, Clone, Copy)]
pub(crate) struct Capture {
    stacks: StackMode,
    depth: usize,
    scopes: bool,
}

impl CaptureFlags {
    pub(crate) fn new(config: &RecordConfig) -> Self {
        let f = CaptureFlags::default();
        f.set(config);
        f
    }

    pub(crate) fn set(&self, c: &RecordConfig) {
        let mode = match c.stacks {
            StackMode::Off => 0,
            StackMode::Fast => 1,
            StackMode::Full => 2,
        };
        let depth = c.max_depth.min(0xffff) as u32;
        let on_frees = c.context == ContextLevel::All && c.max_entries > 0;
        let v = mode
            | u32::from(c.scopes) << 2
            | u32::from(c.wants_context()) << 3
            | u32::from(on_frees) << 4
            | depth << 16;
        self.0.store(v, Ordering::Relaxed);
    }

    /// What to capture when a buffer is dropped: only where the history keeps context on frees.
    #[inline]
    pub(crate) fn get_for_free(&self) -> Option<Capture> {
        if self.0.load(Ordering::Relaxed) & 16 == 0 {
            return None;
        }
        self.get()
    }

    /// Whether a free may be parked (see `alloc::park`): unless the history keeps context on
    /// frees (whose capture needs the freeing thread's stack at the free).
    #[inline]
    pub(crate) fn parks(&self) -> bool {
        self.0.load(Ordering::Relaxed) & 16 == 0
    }

    /// Whether nothing at all is recorded (no stacks, scopes or history): the heap needs no
    /// word of an allocation that reuses a block as it lies.
    #[inline]
    pub(crate) fn records_nothing(&self) -> bool {
        self.0.load(Ordering::Relaxed) & 8 == 0
    }

    /// What to capture, or `None` when allocations record no context.
    #[inline]
    pub(crate) fn get(&self) -> Option<Capture> {
        let v = self.0.load(Ordering::Relaxed);
        if v & 8 == 0 {
            return None;
        }
        let stacks = match v & 3 {
            0 => StackMode::Off,
            1 => StackMode::Fast,
            _ => StackMode::Full,
        };
        Some(Capture { stacks, depth: (v >> 16) as usize, scopes: v & 4 != 0 })
    }
}

impl Pending {
    #[inline]
    pub(crate) fn capture(config: Capture) -> Pending {
        let has_stack = config.stacks != StackMode::Off && config.depth > 0;
        let (hash, version) = if has_stack {
            with_scratch(|s| {
                let c = capture(config.stacks, &mut s.ips[..config.depth.min(MAX_STACK_DEPTH)]);
                s.len = c.len;
                (c.hash, c.version.map(|v| (v, c.len)))
            })
        } else {
            (0, None)
        };
        let (scope, counter) = if config.scopes { scope::current_counted() } else { (scope::ROOT, None) };
        Pending { scope, counter, thread: thread_id(), step: current_step(), has_stack, hash, version }
    }

    /// What identifies this capture's site on its thread, without the allocator's tables: the
    /// unwinder's trace version and the stack's length (equal on one thread: the same frames,
    /// as [`intern`](Self::intern) relies on too) or `(0, 0)` without a stack, and the scope.
    /// `None` where the stack was taken by an unwinder without versions.
    #[inline]
    pub(crate) fn site_key(&self) -> Option<(u64, usize, u32)> {
        match (self.has_stack, self.version) {
            (false, _) => Some((0, 0, self.scope)),
            (true, Some((version, len))) => Some((version, len, self.scope)),
            (true, None) => None,
        }
    }

    /// Counts an allocation in the captured scope (see [`Scope::allocations`]).
    #[inline]
    pub(crate) fn count_allocation(&self) {
        if let Some(n) = self.counter {
            n.add();
        }
    }

    /// Interns the captured stack and site; must run on the thread that captured.
    ///
    /// Where the thread's last capture interned here had the same unwinder trace version and
    /// length (so the same frames, see `unwind::Captured::version`) and the same scope, it is the
    /// same site: the stack is neither hashed into the table nor compared again.
    #[inline]
    pub(crate) fn intern(self, rec: &mut Recorder) -> Context {
        let slot = self.thread as usize % LAST_SITES;
        if let (Some((version, len)), Some(last)) = (self.version, rec.last_site.get(slot)) {
            if (last.thread, last.version, last.len, last.scope) == (self.thread, version, len, self.scope) {
                return Context { site: last.site, step: self.step };
            }
        }
        let table = &mut rec.stacks;
        let stack = self.has_stack.then(|| with_scratch(|s| table.intern_hashed(&s.ips[..s.len], self.hash)));
        let site = rec.sites.intern(Site { stack, scope: self.scope, thread: self.thread });
        if let Some((version, len)) = self.version {
            if rec.last_site.is_empty() {
                rec.last_site = vec![LastSite::default(); LAST_SITES];
            }
            rec.last_site[slot] = LastSite { thread: self.thread, version, len, scope: self.scope, site };
        }
        Context { site, step: self.step }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colliding_hashes_chain() {
        let mut t = StackTable::default();
        // Force a collision by inserting under one hash by hand.
        let a = t.intern(&[7, 8]);
        let h = hash_stack(&[9]);
        t.by_hash.insert(h, a);
        let b = t.intern(&[9]);
        assert_ne!(a, b);
        assert_eq!(t.intern(&[9]), b);
        assert_eq!(t.intern(&[7, 8]), a);
    }

    #[test]
    fn stacks_are_interned_once() {
        let mut t = StackTable::default();
        let a = t.intern(&[1, 2, 3]);
        let b = t.intern(&[1, 2, 3]);
        let c = t.intern(&[1, 2]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(t.len(), 2);
    }
}
