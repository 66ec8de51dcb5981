//! Named scopes, per thread, and the step marker.

use crate::sync::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// The id of the root scope (no scope entered).
pub(crate) const ROOT: u32 = 0;

/// One scope: its parent, its name, and how many allocations were made directly inside it.
struct Node {
    parent: u32,
    name: Arc<str>,
    /// Leaked once per distinct scope path (scopes are never removed), so that the calling
    /// thread can count an allocation without taking the table's lock.
    allocations: &'static Count,
}

/// Shards of a scope's allocation count for threads other than the one that made it: threads
/// whose ids differ modulo this share one.
const SHARDS: usize = 16;

/// One shard, alone on its cache line.
#[repr(align(64))]
#[derive(Debug, Default)]
struct Shard(AtomicU64);

/// How many allocations were made directly inside one scope. The thread that made the scope
/// counts in a word of its own (most scopes are one thread's: a request, a step); other
/// threads count in shards made when the first of them counts, so that threads allocating
/// inside the same scope do not take turns on one cache line (one line written by every
/// thread's allocations would cost each of them more than the rest of recording a parked
/// block's allocation: see `alloc::park`). A scope costs 64 bytes here until a second thread
/// counts in it, not the shards' kilobyte: programs name scopes after requests by the million.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Count {
    owner: u32,
    own: AtomicU64,
    shards: OnceLock<Box<[Shard; SHARDS]>>,
}

impl Count {
    const fn new(owner: u32) -> Count {
        Count { owner, own: AtomicU64::new(0), shards: OnceLock::new() }
    }

    /// Counts one allocation of the calling thread.
    #[inline]
    pub(crate) fn add(&self) {
        let t = thread_id();
        if t == self.owner {
            self.own.fetch_add(1, Ordering::Relaxed);
        } else {
            let shards = self.shards.get_or_init(|| Box::new([const { Shard(AtomicU64::new(0)) }; SHARDS]));
            shards[t as usize % SHARDS].0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn get(&self) -> u64 {
        let others =
            self.shards.get().map_or(0, |s| s.iter().map(|s| s.0.load(Ordering::Relaxed)).fold(0, u64::wrapping_add));
        self.own.load(Ordering::Relaxed).wrapping_add(others)
    }
}

struct Table {
    /// Every scope; index 0 is the root.
    nodes: Vec<Node>,
    ids: HashMap<(u32, Arc<str>), u32>,
}

/// Allocations outside any scope are not counted (every thread would contend for it).
static ROOT_ALLOCATIONS: Count = Count::new(u32::MAX);

fn table() -> &'static Mutex<Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let root = Node { parent: ROOT, name: Arc::from(""), allocations: &ROOT_ALLOCATIONS };
        Mutex::new(Table { nodes: vec![root], ids: HashMap::new() })
    })
}

thread_local! {
    /// The calling thread's scope and its allocation counter.
    static CURRENT: Cell<(u32, &'static Count)> = const { Cell::new((ROOT, &ROOT_ALLOCATIONS)) };
    static THREAD: Cell<u32> = const { Cell::new(u32::MAX) };
}

static STEP: AtomicU64 = AtomicU64::new(0);
static NEXT_THREAD: AtomicU32 = AtomicU32::new(0);

fn thread_names() -> &'static Mutex<Vec<String>> {
    static NAMES: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    NAMES.get_or_init(|| Mutex::new(Vec::new()))
}

/// A small number for the calling thread, stable for its life; its name is kept for reports.
pub(crate) fn thread_id() -> u32 {
    THREAD.with(|t| {
        let id = t.get();
        if id != u32::MAX {
            return id;
        }
        let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        let name = std::thread::current().name().map_or_else(|| format!("thread-{id}"), str::to_string);
        let mut names = thread_names().lock();
        if names.len() <= id as usize {
            names.resize(id as usize + 1, String::new());
        }
        names[id as usize] = name;
        t.set(id);
        id
    })
}

/// The name of a thread numbered by [`thread_id`].
pub(crate) fn thread_name(id: u32) -> String {
    thread_names().lock().get(id as usize).cloned().unwrap_or_else(|| format!("thread-{id}"))
}

/// The scope id of the calling thread.
#[inline]
pub(crate) fn current_id() -> u32 {
    CURRENT.with(Cell::get).0
}

/// The calling thread's scope with its allocation counter (`None` at the root).
#[inline]
pub(crate) fn current_counted() -> (u32, Option<&'static Count>) {
    let (id, n) = CURRENT.with(Cell::get);
    (id, (id != ROOT).then_some(n))
}

/// Makes scope `id` current on the calling thread.
fn set_current(id: u32) {
    let counter = if id == ROOT {
        &ROOT_ALLOCATIONS
    } else {
        table().lock().nodes.get(id as usize).map_or(&ROOT_ALLOCATIONS, |n| n.allocations)
    };
    CURRENT.with(|c| c.set((id, counter)));
}

/// Allocations made inside scope `id` or any scope within it, by allocators recording scopes.
pub(crate) fn allocations_within(id: u32) -> u64 {
    let t = table().lock();
    let counts = t.nodes.iter().enumerate().map(|(i, node)| (i as u32, node.allocations.get()));
    counts.filter(|&(i, n)| n > 0 && t.within(i, id)).map(|(_, n)| n).sum()
}

/// The path of scope `id`, outermost first (`["train", "forward"]`).
pub(crate) fn path(id: u32) -> Vec<String> {
    let t = table().lock();
    t.ancestry(id).iter().map(|&i| t.name(i)).collect()
}

/// Scope paths a snapshot keeps whole; deeper ones keep their outermost
/// [`KEPT_OUTER`] and innermost [`KEPT_INNER`] names with one entry between them saying how
/// many were left out, so that a snapshot of deeply nested scopes stays linear in them
/// (10,000 nested scopes would otherwise store 50 million names).
pub const MAX_SCOPE_DEPTH: usize = 64;
/// The outermost names of a cut path (where memory tests and reports match a path's start).
pub const KEPT_OUTER: usize = 48;
/// The innermost names of a cut path.
pub const KEPT_INNER: usize = 15;

/// The path of scope `id` as a snapshot stores it: whole up to [`MAX_SCOPE_DEPTH`] names,
/// else cut in the middle (`…, "… 9,937 scopes …", …`).
pub(crate) fn snapshot_path(id: u32) -> Vec<String> {
    let t = table().lock();
    let ids = t.ancestry(id);
    let name = |&i: &u32| t.name(i);
    if ids.len() <= MAX_SCOPE_DEPTH {
        return ids.iter().map(name).collect();
    }
    let cut = ids.len() - KEPT_OUTER - KEPT_INNER;
    let mut out: Vec<String> = ids[..KEPT_OUTER].iter().map(name).collect();
    out.push(format!("… {} scopes …", crate::error::thousands(cut as u64)));
    out.extend(ids[ids.len() - KEPT_INNER..].iter().map(name));
    out
}

/// Whether scope `id` is `ancestor` or lies inside it.
pub(crate) fn is_within(id: u32, ancestor: u32) -> bool {
    table().lock().within(id, ancestor)
}

impl Table {
    /// Scope `id` and the scopes it lies in, outermost first, the root left out.
    fn ancestry(&self, id: u32) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut i = id;
        while i != ROOT {
            let Some(node) = self.nodes.get(i as usize) else { break };
            ids.push(i);
            i = node.parent;
        }
        ids.reverse();
        ids
    }

    /// The name of scope `id`, which exists.
    fn name(&self, id: u32) -> String {
        self.nodes[id as usize].name.to_string()
    }

    /// Whether scope `id` is `ancestor` or lies inside it (under the table's lock).
    fn within(&self, id: u32, ancestor: u32) -> bool {
        let mut i = id;
        loop {
            if i == ancestor {
                return true;
            }
            if i == ROOT {
                return false;
            }
            match self.nodes.get(i as usize) {
                Some(node) => i = node.parent,
                None => return false,
            }
        }
    }
}

/// The scope `name` inside `parent`, with its counter, made on first use.
fn child_counted(parent: u32, name: &str) -> (u32, &'static Count) {
    let mut t = table().lock();
    let name: Arc<str> = Arc::from(name);
    if let Some(&id) = t.ids.get(&(parent, name.clone())) {
        return (id, t.nodes[id as usize].allocations);
    }
    let id = t.nodes.len() as u32;
    let allocations: &'static Count = Box::leak(Box::new(Count::new(thread_id())));
    t.nodes.push(Node { parent, name: name.clone(), allocations });
    t.ids.insert((parent, name), id);
    (id, allocations)
}

#[cfg(any(test, feature = "tracing"))]
pub(crate) fn child(parent: u32, name: &str) -> u32 {
    child_counted(parent, name).0
}

/// Makes scope `id` current (by id, for the tracing layer).
#[cfg(feature = "tracing")]
pub(crate) fn restore(id: u32) {
    set_current(id);
}

/// While alive, allocations on this thread are attributed to a scope. Made by [`scope`] and
/// [`Scope::enter`]; dropping it leaves the scope it entered. Not `Send`: scopes are per
/// thread.
///
/// Guards dropped in the order they were made (the usual nesting) each restore the scope that
/// was current before them. A guard dropped before a guard made after it (two guards in a `Vec`,
/// or `drop(outer)` first) leaves only its own scope, as `tracing`'s registry removes an
/// exited span wherever it sits: the scopes entered after it stay current while their guards
/// live, and when the last of them drops the thread is back in the scope it was in before the
/// first. No scope stays current without a guard.
///
/// ```
/// let outer = vramscope::scope("outer");
/// let inner = vramscope::scope("inner");
/// drop(outer);
/// assert_eq!(vramscope::current_scope().path(), ["outer", "inner"]); // inner's guard lives
/// drop(inner);
/// assert!(vramscope::current_scope().path().is_empty()); // no guard: no scope
/// ```
#[must_use = "the scope ends when the guard is dropped"]
#[derive(Debug)]
pub struct ScopeGuard {
    /// This guard's place among the thread's live guards.
    token: u64,
    _not_send: PhantomData<*const ()>,
}

thread_local! {
    /// The thread's live guards in the order they were made, each with the scope that was
    /// current before it (with its counter): what dropping it restores.
    static GUARDS: std::cell::RefCell<Vec<(u64, (u32, &'static Count))>> = const { std::cell::RefCell::new(Vec::new()) };
    static NEXT_GUARD: Cell<u64> = const { Cell::new(0) };
}

impl ScopeGuard {
    /// A guard for a scope just made current, `previous` having been current before it.
    fn new(previous: (u32, &'static Count)) -> ScopeGuard {
        let token = NEXT_GUARD.with(|n| {
            let t = n.get();
            n.set(t.wrapping_add(1));
            t
        });
        GUARDS.with(|g| g.borrow_mut().push((token, previous)));
        ScopeGuard { token, _not_send: PhantomData }
    }
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        let _ = GUARDS.try_with(|g| {
            let mut g = g.borrow_mut();
            match g.iter().rposition(|e| e.0 == self.token) {
                // The newest guard: its scope ends, the one before it is current again.
                Some(i) if i + 1 == g.len() => {
                    let (_, previous) = g.remove(i);
                    CURRENT.with(|c| c.set(previous));
                }
                // Dropped before guards made after it: the newer ones stay current, and the
                // next of them will restore what this one would have.
                Some(i) => {
                    let (_, previous) = g.remove(i);
                    g[i].1 = previous;
                }
                None => {}
            }
        });
    }
}

/// Enters a scope named `name` inside the calling thread's current scope, until the guard drops.
///
/// ```
/// let _train = vramscope::scope("train");
/// {
///     let _fwd = vramscope::scope("forward");
///     assert_eq!(vramscope::current_scope().path(), ["train", "forward"]);
/// }
/// assert_eq!(vramscope::current_scope().path(), ["train"]);
/// ```
///
/// Each distinct scope path is kept for the life of the process (recorded allocations name it
/// by number): about 280 bytes each, so a scope per request costs 280 MB per million
/// requests. Name scopes after what code runs (`"decode"`); a request's number fits in a
/// [`step`](crate::step).
pub fn scope(name: &str) -> ScopeGuard {
    let previous = CURRENT.with(Cell::get);
    let entered = child_counted(previous.0, name);
    CURRENT.with(|c| c.set(entered));
    ScopeGuard::new(previous)
}

/// A scope that can be carried to another thread and entered there.
///
/// ```
/// let _outer = vramscope::scope("loader");
/// let here = vramscope::current_scope();
/// std::thread::spawn(move || {
///     let _g = here.enter(); // the spawned thread's allocations count under "loader"
///     assert_eq!(vramscope::current_scope().path(), ["loader"]);
/// })
/// .join()
/// .unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope(u32);

impl Scope {
    pub(crate) fn id(self) -> u32 {
        self.0
    }

    /// Makes this scope current on the calling thread until the guard drops.
    pub fn enter(self) -> ScopeGuard {
        let previous = CURRENT.with(Cell::get);
        set_current(self.0);
        ScopeGuard::new(previous)
    }

    /// The scope's path, outermost first.
    pub fn path(self) -> Vec<String> {
        path(self.0)
    }

    /// Allocations made so far inside this scope or any scope within it, by every allocator
    /// that records scopes (freed ones included): how a memory test tells a body that
    /// allocated nothing it could see.
    ///
    /// ```
    /// let alloc = vramscope::CachingAllocator::new(vramscope::backend::HostBackend::new(64 << 20));
    /// let _g = vramscope::scope("counted");
    /// let here = vramscope::current_scope();
    /// let before = here.allocations();
    /// drop(alloc.alloc::<u8>(&alloc.default_stream(), 10).unwrap());
    /// assert_eq!(here.allocations(), before + 1);
    /// ```
    pub fn allocations(self) -> u64 {
        allocations_within(self.0)
    }

    /// Runs `future` inside this scope: the scope is entered around every poll, on whichever
    /// thread polls it, so that a task spawned on a multi-threaded runtime counts under it.
    /// This is the way to carry a scope into async code; a [`ScopeGuard`] is tied to its thread
    /// and cannot be held across an `.await` in a `Send` future.
    ///
    /// ```
    /// use std::future::Future;
    /// let _test = vramscope::scope("my_test");
    /// let here = vramscope::current_scope();
    /// let task = here.wrap(async { vramscope::current_scope().path() });
    /// // e.g. tokio::spawn(task); here polled by hand:
    /// std::thread::spawn(move || {
    ///     let mut task = std::pin::pin!(task);
    ///     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    ///     assert_eq!(task.as_mut().poll(&mut cx), std::task::Poll::Ready(vec!["my_test".to_string()]));
    /// })
    /// .join()
    /// .unwrap();
    /// ```
    pub fn wrap<F: std::future::Future>(self, future: F) -> Scoped<F> {
        Scoped { scope: self, future }
    }
}

/// A future that runs inside a scope; made by [`Scope::wrap`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Scoped<F> {
    scope: Scope,
    future: F,
}

impl<F: std::future::Future> std::future::Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        // SAFETY: `future` is structurally pinned: it is never moved out of `Scoped` (there is
        // no method that does, and `Scoped` has no `Drop` impl), and `Scoped` is `Unpin` only
        // when `F` is.
        let (scope, future) = unsafe {
            let this = self.get_unchecked_mut();
            (this.scope, std::pin::Pin::new_unchecked(&mut this.future))
        };
        let _guard = scope.enter();
        future.poll(cx)
    }
}

/// The calling thread's current scope.
pub fn current_scope() -> Scope {
    Scope(current_id())
}

/// Marks the start of iteration (step, epoch) `n`, process-wide: allocations made from now on
/// record `n`, so that reports can tell what each step allocated.
///
/// Unlike scopes, which are per thread, the step is one value for the whole process: a
/// training loop's step is the program's, and the data-loader or worker threads that allocate
/// for it should record the same step without being told. Two loops stepping independently in
/// one process (two tests on parallel threads) overwrite each other's step; memory tests do not
/// use it (they count per scope).
pub fn step(n: u64) {
    STEP.store(n, Ordering::Relaxed);
}

/// The step set by the last [`step`] call (0 before any).
pub fn current_step() -> u64 {
    STEP.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scope costs one cache line until another thread counts in it, and every thread's
    /// allocations are counted, the maker's and the others'.
    #[test]
    fn a_scope_counts_every_thread_in_one_line_until_shared() {
        assert_eq!(std::mem::size_of::<Count>(), 64);
        let (_, count) = child_counted(ROOT, "counted by three threads");
        count.add();
        count.add();
        assert!(count.shards.get().is_none(), "the maker's count needs no shards");
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| (0..1000).for_each(|_| count.add()));
            }
        });
        assert!(count.shards.get().is_some());
        assert_eq!(count.get(), 2002);
    }

    #[test]
    fn deep_paths_are_cut_in_the_middle_for_snapshots() {
        let mut id = child(ROOT, "deep 0");
        for i in 1..MAX_SCOPE_DEPTH {
            id = child(id, &format!("deep {i}"));
        }
        assert_eq!(snapshot_path(id), path(id), "64 names: whole");
        for i in MAX_SCOPE_DEPTH..10_000 {
            id = child(id, &format!("deep {i}"));
        }
        let p = snapshot_path(id);
        assert_eq!(p.len(), KEPT_OUTER + 1 + KEPT_INNER);
        assert_eq!(p[0], "deep 0");
        assert_eq!(p[KEPT_OUTER - 1], format!("deep {}", KEPT_OUTER - 1));
        assert_eq!(p[KEPT_OUTER], "… 9,937 scopes …");
        assert_eq!(p.last().unwrap(), "deep 9999");
        assert_eq!(path(id).len(), 10_000, "the scope itself keeps its whole path");
    }

    #[test]
    fn scopes_nest_and_stay_per_thread() {
        let _a = scope("a");
        let _b = scope("b");
        assert_eq!(current_scope().path(), ["a", "b"]);
        let same = child(child(ROOT, "a"), "b");
        assert_eq!(current_id(), same, "paths are interned");
        std::thread::spawn(|| assert!(current_scope().path().is_empty())).join().unwrap();
        drop(_b);
        assert_eq!(current_scope().path(), ["a"]);
    }

    #[test]
    fn threads_get_stable_ids_and_names() {
        let me = thread_id();
        assert_eq!(thread_id(), me);
        let other = std::thread::Builder::new().name("worker-7".into()).spawn(thread_id).unwrap().join().unwrap();
        assert_ne!(other, me);
        assert_eq!(thread_name(other), "worker-7");
    }
}
