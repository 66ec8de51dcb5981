//! The caching allocator: segments from a backend, split into blocks, cached on free.

mod buffer;
pub(crate) mod config;
mod external;
mod free_index;
mod ids;
mod keepalive;

/// The `Arc` of the shared state, and parking's atomics and thread locals: `keepalive.rs` and
/// `park.rs` are also compiled by their loom tests, with loom's in their place.
mod sync_shim {
    pub(crate) use std::sync::{atomic, Arc};
    pub(crate) use std::thread_local;
}
pub(crate) mod heap;
mod oom_snapshot;
mod park;
#[cfg(test)]
mod park_tests;
mod registry;
mod snapshot;
pub(crate) use crate::model::stats;
pub use stats::{Counter, MemoryStats, Pool, PoolCounters};

pub use buffer::{Buffer, Pod};
pub use config::{AllocatorConfig, LimitMax, ALLOC_CONF_ENV, MAX_FRAGMENTATION_LIMIT, ROUNDUP_INTERVALS};
pub use heap::TensorMeta;

use crate::backend::{Backend, IntoBackend};
use crate::error::{Error, InvalidRequest, Result, UsageError};
use crate::frames::Symbolizer;
use crate::record::{CaptureFlags, Pending, RecordConfig};
use crate::sync::Mutex;
use heap::Heap;
use keepalive::KeepAlive;
use std::collections::BTreeMap;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_ALLOCATOR_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Shared {
    pub(crate) id: u64,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) heap: Mutex<Locked>,
    /// What to capture per allocation, read before taking the lock.
    pub(crate) capture: CaptureFlags,
    /// Symbols resolved so far, kept across snapshots.
    pub(crate) symbols: Mutex<Symbolizer>,
    /// Set while threads may not park blocks: the last handle is going (see `park`).
    closed: AtomicBool,
    /// Set while frees wait for other streams' events: the heap completes those at its next
    /// allocation, before it reuses the block freed last, so a thread takes nothing back from
    /// its slot meanwhile (see `park`). Kept by the allocations and frees that take the lock.
    waiting: AtomicBool,
    /// Set for good the first time a free that could park found the lock held by another
    /// thread: from then on every free that may park does (see `park`), so that threads stop
    /// touching the lock at all in their steady state. An allocator used by one thread at a
    /// time never parks: its lock is always free, and parking would only defer its frees.
    contended: AtomicBool,
}

/// What the allocator's lock protects: the heap, and what keeps the allocator alive for its
/// buffers (the protocol and its invariant: [`keepalive`]).
pub(crate) struct Locked {
    pub(crate) heap: Heap,
    keepalive: KeepAlive<Shared>,
    /// Every thread's parking slot (see `park`).
    parking: park::Parking,
}

impl Locked {
    /// Takes every parked block back into the heap and counts the round trips made through the
    /// slots, so that the heap is exactly what it would be without parking (see `park`).
    #[inline]
    fn pull(&mut self, backend: &dyn Backend) {
        if !self.parking.is_empty() {
            self.pull_parked(backend);
        }
    }

    fn pull_parked(&mut self, backend: &dyn Backend) {
        let heap = &mut self.heap;
        let mut pulled = 0;
        let trips = self.parking.pull(|p| match p {
            park::Pulled::Logged(e) => heap.note_logged(e),
            park::Pulled::Free(b) => {
                heap.free_unrecorded(backend, b);
                pulled += 1;
            }
            park::Pulled::Settle => heap.settle(),
        });
        heap.note_round_trips(&trips);
        self.keepalive.unparked(pulled);
    }
}

/// The last reference is gone, so no buffer exists: give every segment back (waiting first for
/// frees that other streams still hold up). Never panics.
impl Drop for Shared {
    fn drop(&mut self) {
        let backend = &*self.backend;
        let heap = &mut self.heap.get_mut().heap;
        heap.settle();
        heap.release_cache(backend, false);
        heap.release_everything(backend);
    }
}

impl Shared {
    /// Takes the lock with the heap settled: the block the last free kept aside for a request
    /// of its size is merged first, so that what is changed is exactly the heap without that
    /// shortcut. `alloc` and `free` take the lock without it, and reads through
    /// [`Shared::lock_as_is`].
    pub(crate) fn lock(&self) -> crate::sync::MutexGuard<'_, Locked> {
        let mut locked = self.lock_as_is();
        locked.heap.settle();
        locked
    }

    /// Takes the lock for reading, the heap as it is: parked blocks are pulled as for [`Shared::lock`], but the
    /// block the last free kept aside stays as it is, and what is read shows it merged (see
    /// `Heap::hot_merge`). Merging it would hand the next request of its size the best fit
    /// instead of that block: reading statistics or taking a snapshot between a free and the
    /// next allocation changed where blocks went, and so the peak a program reached (16% lower
    /// on `fno_varres` replayed with the statistics read after every operation: 4,004 MiB
    /// against 4,744 unread, `cuMemAlloc` segments).
    pub(crate) fn lock_as_is(&self) -> crate::sync::MutexGuard<'_, Locked> {
        let mut locked = self.heap.lock();
        locked.pull(&*self.backend);
        locked
    }

    /// Takes back the block this thread freed last for a request of `bytes` on `stream`, if
    /// it may (see `park::take`), counting the allocation in its scope; `pending`: what the
    /// allocation records, `key` its site's. Not inlined: an allocator one thread uses never
    /// gets here, and its path stays short.
    #[inline(never)]
    fn take_parked(
        &self,
        stream: ids::StreamId,
        bytes: u64,
        pending: Option<&Pending>,
        key: Option<park::SiteKey>,
    ) -> Option<park::Parked> {
        let recording = match (pending, key) {
            (None, _) => park::Recording::Off,
            (Some(p), Some(key)) => park::Recording::Site(key, p.step),
            (Some(_), None) => return None,
        };
        // A full log (`Took::LogFull`) sends the request through the lock, which pulls; it
        // hardly happens: a park keeps room for the allocation that takes its block back.
        let park::Took::Block(p) = park::take(self.id, stream, bytes, recording) else { return None };
        if let Some(pending) = pending {
            pending.count_allocation();
        }
        Some(p)
    }

    /// Lists a parking slot for the calling thread if it has none and may park: call before
    /// taking the lock, with `may_park` (parking allowed), and bind what the lock gave after.
    #[inline]
    fn wants_slot(&self, may_park: bool) -> bool {
        may_park
            && self.contended.load(Ordering::Relaxed)
            && !self.closed.load(Ordering::Relaxed)
            && !park::is_bound(self.id)
    }

    /// Called from `Buffer::drop` with the buffer's block, if it has one: returns the block and
    /// forgets the buffer, parking the block in the thread's slot where it can (`parkable`:
    /// what of the block parking needs, unless the heap must see the free; `waits`: the free
    /// waits for another stream). Never panics.
    ///
    /// # Safety
    ///
    /// `this` must come from a live buffer of this allocator, which must not use it again.
    pub(crate) unsafe fn release_buffer(
        this: std::ptr::NonNull<Shared>,
        block: Option<ids::BlockId>,
        parkable: Option<park::Parked>,
        waits: bool,
    ) {
        // SAFETY: the buffer counted in `buffers` keeps `keepalive` set, so the allocation lives.
        let shared = unsafe { this.as_ref() };
        // See `alloc`: first, so that the counts the protocol reads are the handles' and
        // `keepalive`'s, as without it.
        #[cfg(vramscope_arc_per_buffer)]
        // SAFETY: balances the increment made for this buffer; `keepalive`, set while the buffer
        // is counted, outlives it.
        unsafe {
            Arc::decrement_strong_count(this.as_ptr().cast_const())
        };
        let records_nothing = shared.capture.records_nothing();
        let parks = shared.capture.parks();
        let may_park = parkable.is_some() && parks;
        let contended = shared.contended.load(Ordering::Relaxed);
        let mut free = None;
        // Whether this free is in the thread's log already (see `park`).
        let mut logged = false;
        if may_park {
            // Parking pays only where threads contend for the lock: a free lock costs less
            // than parking now and pulling later. Once they have, a free does not even try it.
            if !contended {
                free = shared.heap.try_lock();
                if free.is_none() {
                    shared.contended.store(true, Ordering::Relaxed);
                }
            }
            if free.is_none() {
                if let Some(p) = parkable {
                    // Parked, the block stays counted as this buffer was (see `park`).
                    let mut parked = park::park(shared.id, &shared.closed, p, !records_nothing);
                    if parked == Err(park::Unparked::LogFull) {
                        // The lock's holder pulls, emptying the log: wait for that rather than
                        // queue for the lock. A free lock is taken, and pulls here.
                        free = shared.heap.try_lock();
                        if free.is_none() && park::wait_for_room(shared.id, 2) {
                            parked = park::park(shared.id, &shared.closed, p, !records_nothing);
                        }
                    }
                    match parked {
                        Ok(()) => return,
                        Err(u) => logged = u == park::Unparked::Logged,
                    }
                }
            }
        } else if parks && contended && block.is_some() && !waits {
            // Freed through the lock: a block this thread parked before is no longer the one
            // it freed last (`park::park` says the same where it fails). A free that waits for
            // another stream leaves the heap's block freed last as it was, so it stays.
            park::forget_last(shared.id);
        }
        // Who freed it is captured only where the history keeps context on frees.
        let pending = if block.is_some() { shared.capture.get_for_free().map(Pending::capture) } else { None };
        let wants_slot = shared.wants_slot(may_park);
        let mut locked = free.unwrap_or_else(|| shared.heap.lock());
        locked.pull(&*shared.backend);
        if let Some(b) = block {
            if logged {
                locked.heap.free_unrecorded(&*shared.backend, b);
            } else {
                let ctx = pending.map(|p| locked.heap.intern(p));
                locked.heap.free(&*shared.backend, b, ctx);
            }
            if locked.heap.has_pending() && !shared.waiting.load(Ordering::Relaxed) {
                shared.waiting.store(true, Ordering::Relaxed);
            }
        }
        let slot = wants_slot.then(|| locked.parking.register());
        let released = locked.keepalive.buffer_gone();
        drop(locked);
        if let Some(slot) = slot {
            park::bind(shared.id, slot);
        }
        drop(released);
    }
}

/// Environment variable naming a file (or directory) to write a JSON snapshot to when an
/// allocation runs out of memory. The file is complete or absent; links and special files are
/// refused (the error says why); a second snapshot in one process goes to a numbered sibling.
pub const OOM_SNAPSHOT_ENV: &str = "VRAMSCOPE_OOM_SNAPSHOT";

/// What [`CachingAllocator::scope_usage`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScopeUsage {
    /// Bytes of live blocks (block sizes, rounded up from what was asked for).
    pub bytes: u64,
    /// Bytes the live blocks' callers asked for.
    pub requested_bytes: u64,
    /// Live blocks.
    pub blocks: u64,
}

/// A stream of one allocator: blocks freed on it are reused on it at once; blocks used on
/// other streams (see [`CachingAllocator::record_stream`]) wait for those streams first.
///
/// Streams are cheap handles (`Copy`); they belong to the allocator that made them. Methods
/// taking a stream accept it by value or by reference (`impl Into<Stream>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream {
    pub(crate) allocator: u64,
    pub(crate) id: ids::StreamId,
    pub(crate) raw: u64,
}

impl From<&Stream> for Stream {
    fn from(s: &Stream) -> Stream {
        *s
    }
}

impl Stream {
    /// The allocator-local index of this stream; `0` is the default stream.
    pub fn id(&self) -> u32 {
        self.id.0
    }

    /// The backend's handle for this stream.
    pub fn raw(&self) -> u64 {
        self.raw
    }
}

/// An instrumented, stream-aware caching allocator over a [`Backend`].
///
/// Cloning is cheap and gives another handle to the same allocator; it is `Send + Sync`.
///
/// ```
/// use vramscope::{CachingAllocator, backend::HostBackend};
/// let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
/// let stream = alloc.default_stream();
/// let x = alloc.alloc::<f32>(&stream, 1024).unwrap();
/// assert_eq!(alloc.memory_allocated(), 4096);
/// drop(x);
/// assert_eq!(alloc.memory_allocated(), 0);
/// assert_eq!(alloc.memory_reserved(), 2 << 20); // the block stays cached
/// alloc.empty_cache();
/// assert_eq!(alloc.memory_reserved(), 0);
/// ```
#[derive(Clone)]
pub struct CachingAllocator {
    pub(crate) shared: ManuallyDrop<Arc<Shared>>,
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        // SAFETY: `self.shared` is taken once, here, and not used afterwards.
        let ptr = Arc::into_raw(unsafe { ManuallyDrop::take(&mut self.shared) });
        // SAFETY: `ptr` came from `Arc::into_raw` and our strong reference keeps it alive.
        let shared = unsafe { &*ptr };
        let mut locked = shared.heap.lock();
        // SAFETY: `ptr` is our reference, from `Arc::into_raw` above; the `Arc` rebuilt to read
        // the count is never dropped.
        let strong = Arc::strong_count(&ManuallyDrop::new(unsafe { Arc::from_raw(ptr) }));
        if !locked.parking.is_empty() && strong <= 1 + usize::from(locked.keepalive.holds()) {
            // The last handle: no allocation will pull what threads parked, so close parking
            // and pull it now (Dekker's half; see `park`).
            locked.parking.close(&shared.closed);
            locked.pull(&*shared.backend);
        }
        // Decided, and any decrement that leaves other references made, under the lock: so
        // that whoever decides next (a handle's or the last buffer's drop) counts it. Made after
        // unlocking, it raced: with no buffer, handle B could allocate, drop itself, then drop
        // its buffer between our unlock and our decrement; the buffer's drop still counted us,
        // kept the state, and the allocator was never freed (see `keepalive`).
        // SAFETY: `ptr` is our reference, from `Arc::into_raw` above, used only through `after`.
        let after = unsafe { locked.keepalive.handle_gone(ptr) };
        drop(locked);
        // SAFETY: the lock is released; `after` is `handle_gone`'s decision.
        unsafe { after.run() };
    }
}

impl fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("backend", &self.shared.backend.name())
            .field("allocated", &self.memory_allocated())
            .field("reserved", &self.memory_reserved())
            .finish()
    }
}

impl CachingAllocator {
    /// An allocator for device 0 of `backend` with the default configuration.
    pub fn new(backend: impl IntoBackend) -> Self {
        Self::with_config(backend, AllocatorConfig::default()).expect("the default configuration is valid")
    }

    /// An allocator with `config`, which is checked first.
    pub fn with_config(backend: impl IntoBackend, config: AllocatorConfig) -> Result<Self> {
        Self::for_device(backend, 0, config)
    }

    /// An allocator for device `device` of `backend` (the index appears in reports and errors).
    pub fn for_device(backend: impl IntoBackend, device: usize, config: AllocatorConfig) -> Result<Self> {
        config.validate()?;
        let backend = backend.into_backend();
        let record = RecordConfig::default();
        let capture = CaptureFlags::new(&record);
        let heap = Heap::new(device, config, record, &*backend);
        let locked = Locked { heap, keepalive: KeepAlive::new(), parking: park::Parking::default() };
        let id = NEXT_ALLOCATOR_ID.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(Shared {
            id,
            backend,
            heap: Mutex::new(locked),
            capture,
            symbols: Mutex::default(),
            closed: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
            contended: AtomicBool::new(false),
        });
        registry::register(&shared);
        Ok(CachingAllocator { shared: ManuallyDrop::new(shared) })
    }

    /// For tests of parking (see the crate docs, "How the allocator works"): park on every
    /// free the rules allow from now on, as after threads first contended for the lock. What
    /// users can observe must not change.
    #[doc(hidden)]
    pub fn park_always(&self) {
        self.shared.contended.store(true, Ordering::Relaxed);
    }

    /// The backend this allocator draws from.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.backend
    }

    /// The device index.
    pub fn device(&self) -> usize {
        self.shared.lock_as_is().heap.device()
    }

    /// The configuration in force.
    pub fn config(&self) -> AllocatorConfig {
        self.shared.lock_as_is().heap.config().clone()
    }

    /// The backend's default stream.
    pub fn default_stream(&self) -> Stream {
        Stream { allocator: self.shared.id, id: ids::StreamId(0), raw: 0 }
    }

    /// Creates a new stream on the backend.
    pub fn new_stream(&self) -> Result<Stream> {
        let raw = self.shared.backend.create_stream()?;
        let id = self.shared.lock().heap.add_stream(raw)?;
        Ok(Stream { allocator: self.shared.id, id, raw })
    }

    fn check_stream(&self, stream: &Stream) -> Result<()> {
        if stream.allocator != self.shared.id {
            return Err(UsageError::ForeignStream { stream: stream.id.0 }.into());
        }
        Ok(())
    }

    /// Allocates room for `len` values of `T` on `stream`.
    ///
    /// The buffer is ordered on `stream`: the memory is free for use by work queued on `stream`
    /// from now on, and dropping the buffer lets later allocations on `stream` reuse it at once.
    /// A length of zero allocates nothing and always succeeds.
    ///
    /// Fails with [`Error::OutOfMemory`] when the backend cannot supply the memory even after
    /// the allocator released its cache and retried. Element types aligned to more than 512
    /// bytes (the blocks' alignment) are refused at compile time.
    pub fn alloc<T: Pod>(&self, stream: impl Into<Stream>, len: usize) -> Result<Buffer<T>> {
        let stream = &stream.into();
        const {
            assert!(
                std::mem::align_of::<T>() <= heap::MIN_BLOCK as usize,
                "vramscope blocks are aligned to 512 bytes: element types aligned to more cannot be allocated"
            )
        };
        self.check_stream(stream)?;
        let bytes = (len as u64)
            .checked_mul(std::mem::size_of::<T>() as u64)
            .ok_or_else(|| Error::from(InvalidRequest::BytesOverflow { len, element: std::mem::size_of::<T>() }))?;
        let capture = if bytes == 0 { None } else { self.shared.capture.get() };
        let may_park = bytes != 0 && self.shared.capture.parks();
        let shared = NonNull::from(&**self.shared);
        // Captured before anything else: a block taken back needs its site as much as the lock.
        let pending = capture.map(Pending::capture);
        let contended = self.shared.contended.load(Ordering::Relaxed);
        let key = pending.as_ref().and_then(Pending::site_key);
        if may_park && contended && !self.shared.waiting.load(Ordering::Relaxed) {
            if let Some(p) = self.shared.take_parked(stream.id, bytes, pending.as_ref(), key) {
                // A block this thread parked: still allocated in the heap, still counted as a
                // buffer (see `park`).
                #[cfg(vramscope_arc_per_buffer)]
                // SAFETY: as below.
                unsafe {
                    Arc::increment_strong_count(Arc::as_ptr(&self.shared))
                };
                // SAFETY: the parked block was counted in `buffers` when its buffer was made.
                return Ok(unsafe { Buffer::new(shared, p.block, p.addr, len, *stream, p.class, false) });
            }
        }
        let wants_slot = self.shared.wants_slot(may_park);
        let (grant, slot, site) = {
            let mut locked = self.shared.heap.lock();
            locked.pull(&*self.shared.backend);
            if may_park && self.shared.closed.load(Ordering::Relaxed) {
                // A handle allocates: its drop will close parking again if it is the last.
                self.shared.closed.store(false, Ordering::Relaxed);
            }
            let mut site = None;
            let grant = if bytes == 0 {
                None
            } else {
                let ctx = pending.map(|p| {
                    p.count_allocation();
                    locked.heap.intern(p)
                });
                site = ctx.map(|c| c.site);
                match locked.heap.alloc(&*self.shared.backend, stream.id, bytes, ctx) {
                    Ok(g) => Some(g),
                    Err(Error::OutOfMemory(mut report)) => {
                        drop(locked);
                        match self.dump_oom_snapshot() {
                            Some(Ok(path)) => report.snapshot_path = Some(path),
                            Some(Err(why)) => report.snapshot_error = Some(why),
                            None => {}
                        }
                        return Err(Error::OutOfMemory(report));
                    }
                    Err(e) => return Err(e),
                }
            };
            locked.keepalive.buffer_made(&self.shared);
            // Written only when it changes: every thread reads it beside `capture` on its way
            // in, and a store would take that line from them on every allocation.
            let waiting = locked.heap.has_pending();
            if self.shared.waiting.load(Ordering::Relaxed) != waiting {
                self.shared.waiting.store(waiting, Ordering::Relaxed);
            }
            (grant, wants_slot.then(|| locked.parking.register()), site)
        };
        if let Some(slot) = slot {
            park::bind(self.shared.id, slot);
        }
        if let (true, Some(key), Some(site)) = (may_park && contended, key, site) {
            // A request from here may take a block back with this site (see `park`).
            park::remember_site(self.shared.id, key, site);
        }
        // The design the keep-alive protocol replaced, built only to measure the two side by
        // side (BENCHMARKS.md): an `Arc` per buffer, two atomic operations a pair.
        #[cfg(vramscope_arc_per_buffer)]
        // SAFETY: `self.shared` is a live `Arc`; `release_buffer` gives the reference back.
        unsafe {
            Arc::increment_strong_count(Arc::as_ptr(&self.shared))
        };
        Ok(match grant {
            Some(g) => {
                // SAFETY: the buffer was counted in `buffers` above, with `keepalive` set.
                unsafe { Buffer::new(shared, g.block, g.addr, len, *stream, g.class, g.lent) }
            }
            // SAFETY: as above.
            None => unsafe { Buffer::empty(shared, *stream) },
        })
    }

    /// Allocates a tensor of `shape` on `stream`: [`alloc`](Self::alloc) of the shape's element
    /// count and [`Buffer::with_shape`] in one call.
    ///
    /// ```
    /// # use vramscope::{CachingAllocator, backend::HostBackend};
    /// let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
    /// let kv = alloc.alloc_shaped::<f32>(alloc.default_stream(), &[2, 8, 128])?;
    /// assert_eq!((kv.len(), kv.tensor_meta().unwrap().shape), (2 * 8 * 128, vec![2, 8, 128]));
    /// # Ok::<(), vramscope::Error>(())
    /// ```
    pub fn alloc_shaped<T: Pod>(&self, stream: impl Into<Stream>, shape: &[usize]) -> Result<Buffer<T>> {
        let len = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| Error::from(InvalidRequest::ShapeOverflow { shape: shape.to_vec() }))?;
        self.alloc::<T>(stream, len)?.with_shape(shape)
    }

    /// Where [`OOM_SNAPSHOT_ENV`] asks, writes a snapshot after an out-of-memory error: to the
    /// file it names, or, if that is a directory, to a new `oom-<pid>-<n>.json` inside it. The
    /// file is written beside its destination under a temporary name and renamed into place, so
    /// it is complete or absent; a link or a special file at the destination is refused; writers
    /// take turns, in this process and (through a lock on the directory) across processes; a
    /// file is replaced only when it is an earlier run's (older than this process), and a second
    /// snapshot to the same file, from this process or another of the same job, goes to a
    /// numbered sibling (`oom-2.json`), so that each error names the file holding its own
    /// snapshot. An empty value, or a file in a directory that does not exist, is refused.
    fn dump_oom_snapshot(&self) -> Option<std::result::Result<String, String>> {
        let target = std::path::PathBuf::from(std::env::var_os(OOM_SNAPSHOT_ENV)?);
        let written = oom_snapshot::write(&target, || self.snapshot().to_json());
        Some(match written {
            Ok(path) => Ok(path.display().to_string()),
            Err(why) => {
                self.shared.lock_as_is().heap.set_last_error(format!("writing the OOM snapshot: {why}"));
                Err(why)
            }
        })
    }

    /// Marks `buffer` as used by work on `stream`: when the buffer is dropped, its block is reused
    /// only after the work queued on `stream` up to that moment is done (an event is recorded
    /// on `stream` at drop time).
    pub fn record_stream<T>(&self, buffer: &Buffer<T>, stream: impl Into<Stream>) -> Result<()> {
        let stream = &stream.into();
        self.check_stream(stream)?;
        if !std::ptr::eq(buffer.shared.as_ptr(), Arc::as_ptr(&self.shared)) {
            return Err(UsageError::ForeignBuffer.into());
        }
        if let Some(block) = buffer.block() {
            self.shared.lock().heap.record_stream(block, stream.id);
            buffer.note_use(stream.id);
        }
        Ok(())
    }

    /// Blocks until the work queued on `stream` is done and completes the frees that waited on it.
    pub fn synchronize(&self, stream: impl Into<Stream>) -> Result<()> {
        let stream = &stream.into();
        self.check_stream(stream)?;
        let mark = self.shared.lock().heap.event_mark();
        self.shared.backend.synchronize(stream.raw)?;
        self.shared.lock().heap.synchronized(&*self.shared.backend, Some(stream.id), mark);
        Ok(())
    }

    /// Releases every cached segment that holds no live block (waiting for pending frees first),
    /// and, where the backend can unmap, the pages under free holes of the others.
    pub fn empty_cache(&self) {
        self.shared.lock().heap.release_cache(&*self.shared.backend, true);
    }

    /// Bytes in blocks handed out to live buffers (PyTorch's `memory_allocated`).
    pub fn memory_allocated(&self) -> u64 {
        self.shared.lock_as_is().heap.stats().allocated_bytes.current()
    }

    /// Bytes held from the backend (PyTorch's `memory_reserved`).
    pub fn memory_reserved(&self) -> u64 {
        self.shared.lock_as_is().heap.stats().reserved_bytes.current()
    }

    /// Peak of [`memory_allocated`](Self::memory_allocated) since creation or the last
    /// [`reset_peak_stats`](Self::reset_peak_stats).
    pub fn max_memory_allocated(&self) -> u64 {
        self.shared.lock_as_is().heap.stats().allocated_bytes.peak()
    }

    /// Peak of [`memory_reserved`](Self::memory_reserved).
    pub fn max_memory_reserved(&self) -> u64 {
        self.shared.lock_as_is().heap.stats().reserved_bytes.peak()
    }

    /// The fragmentation limit in force: [`AllocatorConfig::fragmentation_limit`] as raised on
    /// churn, up to [`AllocatorConfig::fragmentation_limit_max`]; `None` when there is none.
    ///
    /// ```
    /// use vramscope::{CachingAllocator, backend::SimBackend};
    /// let alloc = CachingAllocator::new(SimBackend::new(1 << 30));
    /// assert_eq!(alloc.fragmentation_limit(), Some(1.05));
    /// ```
    pub fn fragmentation_limit(&self) -> Option<f64> {
        self.shared.lock_as_is().heap.fragmentation_limit()
    }

    /// Sets every peak statistic to its current value (as a read, it leaves the block freed
    /// last where it is: see the crate docs, "Reading changes nothing").
    pub fn reset_peak_stats(&self) {
        self.shared.lock_as_is().heap.reset_peaks();
    }

    /// Sets the accumulated totals (`.allocated`, `.freed`, retries, OOMs) to zero.
    pub fn reset_accumulated_stats(&self) {
        self.shared.lock().heap.reset_accumulated();
    }

    /// All statistics, typed: current, peak, allocated and freed of every counter, per pool.
    pub fn stats(&self) -> MemoryStats {
        self.shared.lock_as_is().heap.settled_stats().public()
    }

    /// All statistics with PyTorch's key names (`allocated_bytes.all.current`,
    /// `reserved_bytes.large_pool.peak`, `num_alloc_retries`, ...), plus vramscope's
    /// `num_device_map`, `num_device_unmap` and `num_backend_errors`: the map of
    /// [`MemoryStats::to_pytorch_map`] over [`CachingAllocator::stats`].
    pub fn memory_stats(&self) -> BTreeMap<String, u64> {
        self.stats().to_pytorch_map()
    }

    /// The statistics as PyTorch's `memory_summary()` table.
    pub fn memory_summary(&self) -> String {
        let (stats, device) = {
            let locked = self.shared.lock_as_is();
            (locked.heap.settled_stats().public(), locked.heap.device())
        };
        stats::summary_table(&stats, self.shared.backend.name(), device, false)
    }

    /// Changes what the allocator records, at run time, like PyTorch's
    /// `torch.cuda.memory._record_memory_history`. [`RecordConfig::off`] stops recording;
    /// the history keeps its newest `max_entries` events.
    pub fn record_memory_history(&self, config: RecordConfig) {
        let mut locked = self.shared.lock_as_is();
        self.shared.capture.set(&config);
        locked.heap.set_record_config(config);
    }

    /// What the allocator records now.
    pub fn record_config(&self) -> RecordConfig {
        self.shared.lock_as_is().heap.recorder().config.clone()
    }

    /// Empties the history (blocks keep their context).
    pub fn clear_history(&self) {
        self.shared.lock_as_is().heap.clear_history();
    }

    /// Live bytes and blocks allocated inside `scope` (or scopes within it), on any thread.
    /// Needs scopes recorded ([`RecordConfig::scopes`], on by default); without them every
    /// block counts as outside.
    ///
    /// ```
    /// use vramscope::{CachingAllocator, backend::HostBackend};
    /// let alloc = CachingAllocator::new(HostBackend::new(1 << 30));
    /// let s = alloc.default_stream();
    /// let outside = alloc.alloc::<u8>(&s, 512).unwrap();
    /// let _g = vramscope::scope("mine");
    /// let inside = alloc.alloc::<u8>(&s, 1024).unwrap();
    /// assert_eq!(alloc.scope_usage(vramscope::current_scope()).bytes, 1024);
    /// # drop((outside, inside));
    /// ```
    pub fn scope_usage(&self, scope: crate::record::Scope) -> ScopeUsage {
        self.scope_split(scope).0
    }

    /// Live blocks inside `scope` and outside it, counted under one lock, and whether anything
    /// was ever allocated here inside `scope` (a site of the scope is recorded), live or not.
    pub(crate) fn scope_split(&self, scope: crate::record::Scope) -> (ScopeUsage, ScopeUsage, bool) {
        let locked = self.shared.lock_as_is();
        let heap = &locked.heap;
        let sites = &heap.recorder().sites.sites;
        // The block the last free kept aside is no longer live (see `Shared::read`).
        let kept = heap.kept_aside();
        let mut inside: std::collections::HashMap<u32, bool> = std::collections::HashMap::new();
        let mut within =
            |scope_id: u32| *inside.entry(scope_id).or_insert_with(|| crate::record::is_within(scope_id, scope.id()));
        let (mut usage, mut rest) = (ScopeUsage::default(), ScopeUsage::default());
        heap.for_each_block(|i, _, b| {
            if b.state != heap::BlockState::Allocated || Some(i) == kept {
                return;
            }
            let site = b.ctx.and_then(|ctx| sites.get(ctx.site as usize));
            let u = if site.is_some_and(|s| within(s.scope)) { &mut usage } else { &mut rest };
            u.bytes += b.size;
            u.requested_bytes += b.requested;
            u.blocks += 1;
        });
        let used = usage.blocks > 0 || sites.iter().any(|s| within(s.scope));
        (usage, rest, used)
    }

    /// Every allocator alive in the process (the default devices and those built with
    /// [`new`](Self::new) and friends), in the order they were made: what memory tests measure.
    ///
    /// ```
    /// use vramscope::{CachingAllocator, backend::HostBackend};
    /// let mine = CachingAllocator::new(HostBackend::new(64 << 20));
    /// assert!(CachingAllocator::all().iter().any(|a| a.same_allocator(&mine)));
    /// ```
    pub fn all() -> Vec<CachingAllocator> {
        registry::live()
    }

    /// Whether `self` and `other` are handles to the same allocator.
    pub fn same_allocator(&self, other: &CachingAllocator) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Waits for every stream of this allocator and completes the frees that waited on them.
    pub fn synchronize_all(&self) -> Result<()> {
        let (raws, mark) = {
            let shared = self.shared.lock();
            (shared.heap.raw_streams().collect::<Vec<u64>>(), shared.heap.event_mark())
        };
        for raw in raws {
            self.shared.backend.synchronize(raw)?;
        }
        // The streams added since were not waited for; their events are not older than `mark`
        // (recorded after their stream existed), so they are queried as before.
        self.shared.lock().heap.synchronized(&*self.shared.backend, None, mark);
        Ok(())
    }

    /// The largest free block in the cache.
    pub fn largest_free_block(&self) -> u64 {
        self.shared.lock_as_is().heap.largest_free()
    }

    /// The last error that happened where it could not be returned (in a `Drop`), if any.
    pub fn last_error(&self) -> Option<String> {
        self.shared.lock_as_is().heap.last_error().map(str::to_string)
    }

    /// Recounts every statistic from the blocks and checks the allocator's structural
    /// invariants: blocks tile their segments, no two blocks overlap, free blocks are merged,
    /// and the counters equal the recount. Returns a description of the first violation.
    ///
    /// It walks every block, so it is for tests and debugging, not for hot paths.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let locked = self.shared.lock();
        heap::check_heap(&locked.heap)
    }
}
