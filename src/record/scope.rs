//! Named scopes, per thread, and the step marker.

use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// The id of the root scope (no scope entered).
pub(crate) const ROOT: u32 = 0;

struct Table {
    /// Parent and name of every scope; index 0 is the root.
    nodes: Vec<(u32, Arc<str>)>,
    ids: HashMap<(u32, Arc<str>), u32>,
}

fn table() -> &'static Mutex<Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(Table { nodes: vec![(ROOT, Arc::from(""))], ids: HashMap::new() }))
}

thread_local! {
    static CURRENT: Cell<u32> = const { Cell::new(ROOT) };
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
    CURRENT.with(Cell::get)
}

/// The path of scope `id`, outermost first (`["train", "forward"]`).
pub(crate) fn path(id: u32) -> Vec<String> {
    let t = table().lock();
    let mut out = Vec::new();
    let mut i = id;
    while i != ROOT {
        let Some((parent, name)) = t.nodes.get(i as usize) else { break };
        out.push(name.to_string());
        i = *parent;
    }
    out.reverse();
    out
}

/// Whether scope `id` is `ancestor` or lies inside it.
pub(crate) fn is_within(id: u32, ancestor: u32) -> bool {
    let t = table().lock();
    let mut i = id;
    loop {
        if i == ancestor {
            return true;
        }
        if i == ROOT {
            return false;
        }
        match t.nodes.get(i as usize) {
            Some((parent, _)) => i = *parent,
            None => return false,
        }
    }
}

fn child(parent: u32, name: &str) -> u32 {
    let mut t = table().lock();
    let name: Arc<str> = Arc::from(name);
    if let Some(&id) = t.ids.get(&(parent, name.clone())) {
        return id;
    }
    let id = t.nodes.len() as u32;
    t.nodes.push((parent, name.clone()));
    t.ids.insert((parent, name), id);
    id
}

/// Enters `name` under the current scope and returns the previous scope id.
#[cfg(feature = "tracing")]
pub(crate) fn enter_named(name: &str) -> u32 {
    let previous = current_id();
    CURRENT.with(|c| c.set(child(previous, name)));
    previous
}

/// Makes scope `id` current again.
#[cfg(feature = "tracing")]
pub(crate) fn restore(id: u32) {
    CURRENT.with(|c| c.set(id));
}

/// While alive, allocations on this thread are attributed to a scope. Made by [`scope`] and
/// [`Scope::enter`]; dropping it restores the scope that was current before. Not `Send`:
/// scopes are per thread.
#[must_use = "the scope ends when the guard is dropped"]
#[derive(Debug)]
pub struct ScopeGuard {
    previous: u32,
    _not_send: PhantomData<*const ()>,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
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
pub fn scope(name: &str) -> ScopeGuard {
    let previous = current_id();
    CURRENT.with(|c| c.set(child(previous, name)));
    ScopeGuard { previous, _not_send: PhantomData }
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
        let previous = current_id();
        CURRENT.with(|c| c.set(self.0));
        ScopeGuard { previous, _not_send: PhantomData }
    }

    /// The scope's path, outermost first.
    pub fn path(self) -> Vec<String> {
        path(self.0)
    }
}

/// The calling thread's current scope.
pub fn current_scope() -> Scope {
    Scope(current_id())
}

/// Marks the start of iteration (step, epoch) `n`, process-wide: allocations made from now on
/// record `n`, so that reports can tell what each step allocated.
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
