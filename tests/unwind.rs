//! The fast unwinder against the `backtrace` crate's, frame by frame, over generated call trees:
//! recursion, generics, closures, trait objects, inlined and `#[inline(never)]` functions,
//! threads, code inside and after a caught panic, async tasks on a tokio runtime.
//!
//! CI runs this file in four builds: dev and release, with the repository's frame pointers and
//! without them (`RUSTFLAGS=""`, as users build). Each prints which it was.

use proptest::prelude::*;
use std::ffi::c_void;
use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use vramscope::record::{capture_stack, fast_fallbacks, fast_unwinder, StackMode, Unwinder};

extern "C" {
    /// libgcc's: the start of the function holding `pc` (the system unwinder's own lookup).
    fn _Unwind_FindEnclosingFunction(pc: *mut c_void) -> *mut c_void;
}

fn enclosing(pc: usize) -> usize {
    // SAFETY: a lookup in the unwind tables of the loaded objects; any address is accepted.
    unsafe { _Unwind_FindEnclosingFunction(pc as *mut c_void) as usize }
}

const DEPTH: usize = 128;
/// Stacks compared, and frames compared in them.
static COMPARED: AtomicUsize = AtomicUsize::new(0);
static FRAMES: AtomicUsize = AtomicUsize::new(0);

/// Takes this point's stack with both unwinders and asserts that every caller of this function
/// is the same return address in both, in the same order, to the same depth.
#[inline(never)]
fn compare_here() {
    let mut ours = [0usize; DEPTH];
    let n = black_box(capture_stack(StackMode::Fast, &mut ours));
    let ours = &ours[..n];
    let mut theirs: Vec<usize> = Vec::new();
    let me = compare_here as *const () as usize;
    let mut mine = None;
    backtrace::trace(|f| {
        if mine.is_none() && f.symbol_address() as usize == me {
            mine = Some(theirs.len());
        }
        theirs.push(f.ip() as usize);
        true
    });
    // libgcc reports one more frame with address 0 where the return address is undefined (a
    // thread's first frame): not a frame.
    while theirs.last() == Some(&0) {
        theirs.pop();
    }
    let mine = mine.expect("the backtrace crate sees compare_here");
    let callers = &theirs[mine + 1..];
    // Our frame in compare_here is the return address from capture_stack; its callers follow.
    let at = ours
        .iter()
        .position(|&ip| enclosing(ip - 1) == me)
        .unwrap_or_else(|| panic!("no frame of compare_here among {} frames: {ours:x?}", ours.len()));
    let ours_callers = &ours[at + 1..];
    let truncated = n == DEPTH;
    let expected = if truncated { &callers[..ours_callers.len().min(callers.len())] } else { callers };
    if ours_callers != expected {
        let both = ours_callers.len().max(expected.len());
        let rows: Vec<String> = (0..both)
            .map(|i| {
                let a = ours_callers.get(i).copied().unwrap_or(0);
                let b = expected.get(i).copied().unwrap_or(0);
                format!("{i:3} {a:#014x} {b:#014x} {}", if a == b { "" } else { "<-" })
            })
            .collect();
        panic!("stacks differ (ours, backtrace's):\n{}", rows.join("\n"));
    }
    COMPARED.fetch_add(1, Ordering::Relaxed);
    FRAMES.fetch_add(ours_callers.len(), Ordering::Relaxed);
}

/// One node of a call tree: how it is called, then its children.
#[derive(Debug, Clone)]
enum Kind {
    Recurse(u8),
    Generic(bool),
    Closure,
    Dyn(bool),
    Inlined,
    Never,
    Thread,
    CatchUnwind,
    AfterPanic,
    Async,
}

#[derive(Debug, Clone)]
struct Node {
    kind: Kind,
    children: Vec<Node>,
}

fn body(node: &Node) {
    compare_here();
    for c in &node.children {
        visit(c);
    }
}

fn visit(node: &Node) {
    match node.kind {
        Kind::Recurse(n) => recurse(node, n),
        Kind::Generic(true) => generic::<u8>(node),
        Kind::Generic(false) => generic::<String>(node),
        Kind::Closure => {
            let pad = black_box([7u8; 48]);
            let f = |n: &Node| {
                black_box(&pad);
                body(n)
            };
            f(black_box(node))
        }
        Kind::Dyn(a) => {
            let walker: &dyn Walk = if black_box(a) { &First } else { &Second(black_box(3)) };
            walker.walk(node)
        }
        Kind::Inlined => inlined(node),
        Kind::Never => never(node, black_box([1u64; 9])),
        Kind::Thread => std::thread::scope(|s| {
            s.spawn(|| body(node)).join().expect("the thread's comparisons pass");
        }),
        Kind::CatchUnwind => {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(node))).expect("no panic");
        }
        Kind::AfterPanic => {
            // An unwind runs through these frames first, then the comparisons run on the same
            // stack that the unwind left.
            let caught = std::panic::catch_unwind(|| panics(black_box(3)));
            assert!(caught.is_err());
            body(node)
        }
        Kind::Async if tokio::runtime::Handle::try_current().is_ok() => {
            // Within a runtime already: poll the task by hand.
            let mut task = std::pin::pin!(task(node));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            while task.as_mut().poll(&mut cx).is_pending() {}
        }
        Kind::Async => {
            let rt = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
            rt.block_on(task(node));
        }
    }
}

#[inline(never)]
fn recurse(node: &Node, n: u8) {
    let pad = black_box([n; 24]);
    if n == 0 {
        body(node)
    } else {
        recurse(node, n - 1);
    }
    black_box(pad);
}

trait Tag: Default {
    fn tag(&self) -> usize;
}
impl Tag for u8 {
    fn tag(&self) -> usize {
        1
    }
}
impl Tag for String {
    fn tag(&self) -> usize {
        self.len() + 2
    }
}

#[inline(never)]
fn generic<T: Tag>(node: &Node) {
    let t = black_box(T::default());
    body(node);
    black_box(t.tag());
}

trait Walk {
    fn walk(&self, node: &Node);
}
struct First;
struct Second(u32);
impl Walk for First {
    fn walk(&self, node: &Node) {
        body(node)
    }
}
impl Walk for Second {
    #[inline(never)]
    fn walk(&self, node: &Node) {
        let v = vec![self.0; 4];
        body(node);
        black_box(v);
    }
}

#[inline(always)]
fn inlined(node: &Node) {
    body(node)
}

#[inline(never)]
fn never(node: &Node, big: [u64; 9]) {
    black_box(&big);
    body(node);
    black_box(big);
}

#[inline(never)]
fn panics(n: u32) -> u32 {
    if black_box(n) > 0 {
        // Without the panic hook: nothing printed.
        std::panic::resume_unwind(Box::new(n));
    }
    n
}

async fn task(node: &Node) {
    tokio::task::yield_now().await;
    body(node);
    tokio::task::yield_now().await;
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        (0u8..6).prop_map(Kind::Recurse),
        any::<bool>().prop_map(Kind::Generic),
        Just(Kind::Closure),
        any::<bool>().prop_map(Kind::Dyn),
        Just(Kind::Inlined),
        Just(Kind::Never),
        Just(Kind::Thread),
        Just(Kind::CatchUnwind),
        Just(Kind::AfterPanic),
        Just(Kind::Async),
    ]
}

fn tree() -> impl Strategy<Value = Node> {
    let leaf = kind().prop_map(|kind| Node { kind, children: Vec::new() });
    leaf.prop_recursive(8, 48, 3, |inner| {
        (kind(), prop::collection::vec(inner, 0..4)).prop_map(|(kind, children)| Node { kind, children })
    })
}

#[test]
fn every_stack_is_the_backtrace_crates() {
    let config = proptest::test_runner::Config { cases: 256, failure_persistence: None, ..Default::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let (stacks, frames) = (COMPARED.load(Ordering::Relaxed), FRAMES.load(Ordering::Relaxed));
    let before = fast_fallbacks();
    if let Err(e) = runner.run(&tree(), |t| {
        visit(&t);
        Ok(())
    }) {
        panic!("{e}");
    }
    let stacks = COMPARED.load(Ordering::Relaxed) - stacks;
    let frames = FRAMES.load(Ordering::Relaxed) - frames;
    println!(
        "{stacks} stacks of 256 call trees, {frames} frames: equal ({} build, frame pointers {}, {:?})",
        if cfg!(debug_assertions) { "dev" } else { "release" },
        vramscope::record::frame_pointers_available(),
        fast_unwinder(),
    );
    assert!(stacks >= 256, "every tree compares at least one stack");
    if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
        assert_eq!(fast_fallbacks(), before, "a stack fell back to the backtrace crate");
    }
}

#[test]
fn deep_stacks_are_the_backtrace_crates_to_the_last_frame() {
    fn deep(n: usize) {
        if n == 0 {
            compare_here();
        } else {
            deep(black_box(n - 1));
            black_box(n);
        }
    }
    // Deeper than the capture: our 128 frames are the first 128 of the unwinder's.
    std::thread::Builder::new().stack_size(8 << 20).spawn(|| deep(300)).unwrap().join().unwrap();
    deep(3);
}

#[test]
fn the_cached_unwinder_took_every_stack() {
    let before = fast_fallbacks();
    for i in 0..50 {
        visit(&Node { kind: [Kind::Never, Kind::Async, Kind::Thread][i % 3].clone(), children: Vec::new() });
    }
    if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
        assert_eq!(fast_unwinder(), Unwinder::CachedTables);
        assert_eq!(fast_fallbacks(), before, "a stack fell back to the backtrace crate");
    }
    assert!(COMPARED.load(Ordering::Relaxed) >= 50);
}

/// Builds a shared library of C code without frame pointers that calls back through a few
/// frames of its own; `None` where no C compiler is found (printed).
fn c_library(dir: &std::path::Path, name: &str, padding: usize) -> Option<std::path::PathBuf> {
    let src = dir.join(format!("{name}.c"));
    // Padding functions move the calling code, so that a library loaded where an unloaded one
    // was has other return addresses than the cached ones.
    let pad: String = (0..padding).map(|i| format!("int pad{i}(int x) {{ return x * {i} + 1; }}\n")).collect();
    std::fs::write(
        &src,
        format!(
            "{pad}
typedef void (*callback)(void *);
__attribute__((noinline)) void inner(callback f, void *data, int n) {{
    volatile char buffer[48];
    buffer[0] = (char)n;
    if (n > 0) inner(f, data, n - 1); else f(data);
    buffer[1] = buffer[0];
}}
void call_through(callback f, void *data, int depth) {{ inner(f, data, depth); __asm__ volatile(\"\"); }}
"
        ),
    )
    .ok()?;
    let out = dir.join(format!("lib{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = std::process::Command::new(&cc)
        .args(["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status();
    match status {
        Ok(s) if s.success() => Some(out),
        other => {
            println!("skipped: {cc} could not build a shared library ({other:?})");
            None
        }
    }
}

extern "C" fn compare_from_c(data: *mut c_void) {
    // SAFETY: `data` is the `Option<String>` that `through_library` passes, alive during the call.
    let failure = unsafe { &mut *data.cast::<Option<String>>() };
    let caught = std::panic::catch_unwind(compare_here);
    if let Err(e) = caught {
        *failure = Some(e.downcast_ref::<String>().cloned().unwrap_or_else(|| "a panic".into()));
    }
}

/// Calls `compare_here` through `call_through` of the library at `path`, then unloads it.
fn through_library(path: &std::path::Path) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: loads a library this test built; its constructor-free C code has no side effects.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {}", path.display());
    // SAFETY: the symbol exists in the library built above, with this signature.
    let call: extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, i32) = unsafe {
        let sym = libc::dlsym(handle, c"call_through".as_ptr());
        assert!(!sym.is_null());
        std::mem::transmute::<*mut c_void, extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, i32)>(sym)
    };
    for depth in [0, 3, 7] {
        let mut failure: Option<String> = None;
        call(compare_from_c, (&raw mut failure).cast(), depth);
        if let Some(f) = failure {
            panic!("through {} at depth {depth}: {f}", path.display());
        }
    }
    // SAFETY: no code or data of the library is in use any more.
    assert_eq!(unsafe { libc::dlclose(handle) }, 0);
}

/// Libraries loaded after the first capture (as cudarc loads the driver) are unwound through,
/// C frames without frame pointers included, and so are libraries loaded where an unloaded one
/// was.
#[test]
fn stacks_through_libraries_loaded_and_unloaded_later() {
    let dir = std::env::temp_dir().join(format!("vramscope-unwind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(first) = c_library(&dir, "first", 0) else { return };
    let Some(second) = c_library(&dir, "second", 40) else { return };
    compare_here();
    let before = fast_fallbacks();
    through_library(&first);
    through_library(&second);
    through_library(&first);
    if cfg!(all(target_arch = "x86_64", target_os = "linux")) {
        assert_eq!(fast_fallbacks(), before, "a stack through C fell back to the backtrace crate");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
