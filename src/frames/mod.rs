//! Whose each frame of a stack is, in one module: what a captured stack loses when it is
//! symbolized, and the rule every report, the memory-test evidence and both PyTorch readers use
//! to name the line that allocated (the site), the lines that called it, and the frames a
//! flamegraph shows.
//!
//! A frame is one of:
//!
//! - a **library's**: Python packages (`site-packages`, `dist-packages`), Rust crates from a
//!   registry or git (`~/.cargo/registry`, `~/.cargo/git`), and frames without a name
//!   (`<unknown>`);
//! - **native code under an interpreter**: in a stack that holds Python frames (a file ending
//!   in `.py`), every other frame. PyTorch records such stacks by default
//!   (`_record_memory_history()`, `stacks="all"`): its own C++ (`c10::`, `at::`, `torch::`),
//!   CPython's (`_PyEval_EvalFrameDefault`, `PyObject_Call`), the C runtime (`__libc_start_main`)
//!   around the Python frames. The program's line is a Python line there, whatever surrounds
//!   it; this holds for any framework called from Python, not only PyTorch;
//! - **a framework's or the runtime's native code** in a stack without Python frames: C++
//!   functions in PyTorch's namespaces (`c10`, `at`, `torch`, `caffe2`, `pybind11`) or `std`,
//!   the interpreter and C runtime (`Py…`, `_Py…`, `__libc_…`, `_start`), and C functions known
//!   by name only (no `::`, no file: `pthread_…`, `__clone`);
//! - otherwise **the program's own**.
//!
//! The user's word comes first ([`FramePolicy`]): a frame whose file or function contains a
//! pattern given as the program's own code is the program's, one that contains a library
//! pattern is a library's (the longer pattern decides where both match, the program's on a
//! tie). That is how a monorepo names its vendored crates or a package installed under
//! `site-packages` in editable mode as what they are.
//!
//! Stacks vramscope captures lose, when they are symbolized (once per address), the frames of
//! vramscope itself, of Rust's runtime (`std::`, `core::`, `alloc::`, `__rust…`), of the test
//! runner (`test::`) and of the unwinder, and everything outside the memory-test harness's call
//! of a test body ([`is_captures_own`], [`is_harness`]): what is left starts at the line that
//! asked for memory. Those rules are here too, so that this module is the one place that says
//! whose a frame is. They are decided once per return address, by the symbol's source file
//! where debug info has one (vramscope's own sources are those under its manifest directory),
//! not per stack. Trimming at capture by stack position instead (dropping the frames below a
//! public entry point) cannot be right in every build: the entry points are generic
//! (`alloc::<T>`), instantiated in the user's crate and inlined into the user's function in
//! release builds, so the return address that names the user's line is the same one that
//! carries the inlined entry point; only its symbol tells the two apart.
//!
//! The site of a stack is its innermost frame of the program's own. A stack with none that ran
//! a PyTorch operator (an allocation on autograd's backward thread, which has no Python frames)
//! is named by that operator: its outermost `at::_ops::…` frame (`at::_ops::mm::call(…)`);
//! reports say `<no stack>` for any other, as for a stack not recorded.

mod symbols;

pub(crate) use symbols::{Symbolizer, INLINED_ELSEWHERE, INLINED_TEST_BODY};

use crate::error::{Error, Result, UsageError};
use crate::record::Frame;
use std::sync::{Arc, OnceLock, RwLock};

/// The environment variable naming the program's own code for every report: patterns
/// separated by commas (see [`FramePolicy`]).
pub const USER_CODE_ENV: &str = "VRAMSCOPE_USER_CODE";
/// The environment variable naming libraries for every report: patterns separated by commas
/// (see [`FramePolicy`]).
pub const LIBRARY_ENV: &str = "VRAMSCOPE_LIBRARY";

/// What the user says about whose frames are whose, ahead of the built-in rule (the module's
/// documentation lists it): patterns of the program's own code and of libraries. A pattern
/// matches a frame whose source file or function name contains it (`vendor/`, `third_party/`,
/// `my_company_utils::`, `/src/mypkg/`). Where patterns of both kinds match, the longer
/// decides (`--library vendor/ --user-code vendor/ours/` keeps `vendor/ours/` the program's);
/// on a tie the frame is the program's.
///
/// Every report of the process uses the policy [`install`](Self::install)ed last; until one
/// is, the policy of the environment variables [`USER_CODE_ENV`] and [`LIBRARY_ENV`] (so a
/// test suite can say it without code: `VRAMSCOPE_LIBRARY=vendor/ cargo test`). The command
/// line's `--user-code` and `--library` install theirs.
///
/// ```
/// use vramscope::report::FramePolicy;
/// let p = FramePolicy::new(["crates/app/"], ["vendor/"]).unwrap();
/// assert!(FramePolicy::new([""], [] as [&str; 0]).is_err(), "an empty pattern would match every frame");
/// # let _ = p;
/// ```
#[derive(Clone, Default)]
pub struct FramePolicy {
    user_code: Vec<String>,
    library: Vec<String>,
    /// The patterns as automata, built at the first frame asked about: thousands of patterns
    /// cost one pass over a frame's names, not one search each.
    matchers: OnceLock<Matchers>,
}

impl std::fmt::Debug for FramePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FramePolicy").field("user_code", &self.user_code).field("library", &self.library).finish()
    }
}

impl PartialEq for FramePolicy {
    fn eq(&self, other: &Self) -> bool {
        self.user_code == other.user_code && self.library == other.library
    }
}

impl Eq for FramePolicy {}

/// One kind's patterns as an automaton, with each pattern's length.
#[derive(Clone)]
struct Matcher {
    automaton: aho_corasick::AhoCorasick,
    lengths: Vec<usize>,
}

impl Matcher {
    fn new(patterns: &[String]) -> Option<Matcher> {
        if patterns.is_empty() {
            return None;
        }
        let automaton = aho_corasick::AhoCorasick::new(patterns).ok()?;
        Some(Matcher { automaton, lengths: patterns.iter().map(String::len).collect() })
    }

    /// The longest pattern found in any of `texts`.
    fn longest<'a>(&self, texts: impl Iterator<Item = &'a str>) -> Option<usize> {
        texts.flat_map(|t| self.automaton.find_overlapping_iter(t)).map(|m| self.lengths[m.pattern().as_usize()]).max()
    }
}

#[derive(Clone)]
struct Matchers {
    user_code: Option<Matcher>,
    library: Option<Matcher>,
}

/// Whose a frame is, by the user's patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    Program,
    Library,
}

impl FramePolicy {
    /// A policy of these patterns. An empty pattern (which would match every frame) is an
    /// error naming its kind.
    pub fn new<U, L>(user_code: U, library: L) -> Result<FramePolicy>
    where
        U: IntoIterator,
        U::Item: Into<String>,
        L: IntoIterator,
        L::Item: Into<String>,
    {
        let check = |kind: &'static str, patterns: Vec<String>| {
            if patterns.iter().any(|p| p.trim().is_empty()) {
                return Err(Error::from(UsageError::EmptyPattern { kind }));
            }
            Ok(patterns)
        };
        Ok(FramePolicy {
            user_code: check("user-code", user_code.into_iter().map(Into::into).collect())?,
            library: check("library", library.into_iter().map(Into::into).collect())?,
            matchers: OnceLock::new(),
        })
    }

    /// The policy of [`USER_CODE_ENV`] and [`LIBRARY_ENV`] (comma-separated patterns; empty
    /// items between commas are skipped). A value that is not UTF-8 is an error naming it.
    pub fn from_env() -> Result<FramePolicy> {
        let list = |key: &str| -> Result<Vec<String>> {
            let text = crate::error::env_text(key)?.unwrap_or_default();
            Ok(text.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect())
        };
        FramePolicy::new(list(USER_CODE_ENV)?, list(LIBRARY_ENV)?)
    }

    /// Makes this the policy of every report in the process from now on.
    pub fn install(self) {
        *slot().write().unwrap_or_else(|e| e.into_inner()) = Arc::new(self);
    }

    /// The policy reports use now.
    pub fn current() -> Arc<FramePolicy> {
        slot().read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The patterns of the program's own code.
    pub fn user_code_patterns(&self) -> &[String] {
        &self.user_code
    }

    /// The library patterns.
    pub fn library_patterns(&self) -> &[String] {
        &self.library
    }

    /// Whether no pattern is given (the built-in rule alone decides).
    pub fn is_empty(&self) -> bool {
        self.user_code.is_empty() && self.library.is_empty()
    }

    /// What the patterns say of a frame, if any matches.
    fn said(&self, f: &Frame) -> Option<Said> {
        if self.is_empty() {
            return None;
        }
        let m = self.matchers.get_or_init(|| Matchers {
            user_code: Matcher::new(&self.user_code),
            library: Matcher::new(&self.library),
        });
        let longest = |m: &Option<Matcher>| {
            m.as_ref().and_then(|m| m.longest(std::iter::once(f.function.as_str()).chain(f.file.as_deref())))
        };
        match (longest(&m.user_code), longest(&m.library)) {
            (Some(u), Some(l)) if l > u => Some(Said::Library),
            (Some(_), _) => Some(Said::Program),
            (None, Some(_)) => Some(Said::Library),
            (None, None) => None,
        }
    }
}

/// The process's policy, first read from the environment (a value that is not UTF-8 is
/// reported once on standard error and left out, as no policy).
fn slot() -> &'static RwLock<Arc<FramePolicy>> {
    static SLOT: OnceLock<RwLock<Arc<FramePolicy>>> = OnceLock::new();
    SLOT.get_or_init(|| {
        RwLock::new(Arc::new(FramePolicy::from_env().unwrap_or_else(|e| {
            eprintln!("vramscope: {e}; reports use the built-in frame rule alone");
            FramePolicy::default()
        })))
    })
}

// ----- stacks vramscope captured ---------------------------------------------------------

/// Function-name prefixes of frames that are not the user's.
const TRIMMED: &[&str] = &[
    "vramscope::",
    "<vramscope::",
    "std::",
    "<std::",
    "core::",
    "<core::",
    "alloc::",
    "<alloc::",
    "backtrace::",
    "<backtrace::",
    "__rust",
    "_rust",
    "rust_begin_unwind",
    "test::",
    "<test::",
    "<F as test::",
    "__libc_start",
    "_start",
    "start_thread",
    "clone",
    "__clone",
    "<unknown>",
];

fn is_trimmed(function: &str) -> bool {
    TRIMMED.iter().any(|p| function.starts_with(p))
}

/// Whether a frame of a stack vramscope captured is vramscope's own, the Rust runtime's, the
/// test runner's or the unwinder's: a trimmed function name, a frame from the standard
/// library's sources (`/rustc/...`, including trait-object shims like
/// `<&dyn Fn() as FnOnce>::call_once`), or the C runtime's `main` without debug info. Such
/// frames are cut from captured stacks when they are symbolized, once per address.
pub(crate) fn is_captures_own(f: &Frame) -> bool {
    is_trimmed(&f.function)
        || f.file.as_deref().is_some_and(is_trimmed_path)
        || (f.file.is_none() && f.function == "main")
}

/// vramscope's own sources, as its debug info names them.
pub(crate) const OWN_SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/");

/// Whether a source path is the standard library's, vramscope's or the unwinder's. Release
/// builds with line tables only name inlined functions without their path (`trace`, `alloc`),
/// so the file is what tells them apart.
fn is_trimmed_path(p: &str) -> bool {
    p.starts_with("/rustc/") || p.starts_with(OWN_SOURCES) || p.contains("/backtrace-0.")
}

/// Whether a frame is the memory-test harness calling a test body: everything outside it
/// (the harness, the user's test function that started it, the test runner) is not where the
/// body allocated, and is cut from stacks when they are symbolized (`Symbolizer`, once
/// per address). The harness's frames are the `testing` module's functions and sources.
pub(crate) fn is_harness(function: &str, file: Option<&str>) -> bool {
    function.starts_with("vramscope::testing::")
        || function.starts_with("<vramscope::testing::")
        || file.and_then(|f| f.strip_prefix(OWN_SOURCES)).is_some_and(|rest| rest.starts_with("testing/"))
}

// ----- whose a frame is, in every report --------------------------------------------------

/// Whether a frame belongs to a library rather than the program being examined.
pub(crate) fn is_library(f: &Frame) -> bool {
    f.file.as_deref().is_some_and(|p| {
        ["site-packages", "dist-packages", "/.cargo/registry/", "/.cargo/git/"].iter().any(|l| p.contains(l))
    }) || f.function.starts_with('<') && f.function.ends_with('>') && f.file.is_none()
}

/// Whether a frame is a Python frame (its file a `.py` file).
fn is_python(f: &Frame) -> bool {
    f.file.as_deref().is_some_and(|p| p.ends_with(".py"))
}

/// C++ namespaces of PyTorch and of the C++ library, whose functions are never the program's.
const NATIVE_NAMESPACES: &[&str] = &["c10", "at", "torch", "caffe2", "pybind11", "std"];

/// Whether a frame of a stack without Python frames is a framework's or the runtime's native
/// code: a C++ function in [`NATIVE_NAMESPACES`] (a return type before the name is skipped:
/// `bool at::cuda::blas::gemm<float>(…)`), or the interpreter's or C runtime's entry points.
fn is_native(f: &Frame) -> bool {
    let name = f.function.as_str();
    if ["Py", "_Py", "__libc_", "_start"].iter().any(|p| name.starts_with(p)) {
        return true;
    }
    // A C function known by its symbol only (`pthread_condattr_setpshared`, `__clone`): a bare
    // identifier without a file. (vramscope's own notes in place of a frame have spaces.)
    if f.file.is_none() && !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return true;
    }
    // The qualified name: before the arguments and template arguments, after a return type.
    let qualified = name.split(['(', '<']).next().unwrap_or("");
    let qualified = qualified.rsplit(' ').next().unwrap_or("");
    let root = qualified.split("::").next().unwrap_or("");
    qualified.contains("::") && NATIVE_NAMESPACES.contains(&root)
}

/// The program's own frames of a stack, innermost first (see the module's rule).
pub(crate) fn program_frames<'a, I>(frames: I) -> impl Iterator<Item = &'a Frame>
where
    I: Iterator<Item = &'a Frame> + Clone,
{
    let python = has_python(frames.clone());
    let policy = FramePolicy::current();
    frames.filter(move |f| match policy.said(f) {
        Some(said) => said == Said::Program,
        None => !is_library(f) && if python { is_python(f) } else { !is_native(f) },
    })
}

/// The operator a stack without frames of the program's own ran: its outermost `at::_ops::`
/// frame, PyTorch's dispatcher entry for the operator the caller asked for.
pub(crate) fn framework_op<'a>(frames: impl Iterator<Item = &'a Frame>) -> Option<&'a Frame> {
    frames.filter(|f| f.function.starts_with("at::_ops::")).last()
}

/// PyTorch's own choice of frames to leave out of what its viewer shows (`frameFilter` in
/// `MemoryViz.js`, `_frame_filter` in `torch.cuda._memory_viz`): the unwinder's, the
/// interpreter's loop and call machinery, and the C runtime's entry. Flamegraphs of stacks that
/// hold Python frames leave them out too; the framework's operators stay.
pub(crate) fn is_unwinding_or_interpreter(f: &Frame) -> bool {
    const FUNCTIONS: &[&str] = &[
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const FILES: &[&str] = &[
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
        "cpython/abstract.h",
    ];
    FUNCTIONS.iter().any(|n| f.function.contains(n))
        || f.file.as_deref().is_some_and(|file| FILES.iter().any(|n| file.contains(n)))
}

/// Whether a stack holds Python frames (then its native frames are the interpreter's and the
/// framework's).
pub(crate) fn has_python<'a>(mut frames: impl Iterator<Item = &'a Frame>) -> bool {
    frames.any(is_python)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_stacks_lose_vramscope_and_the_runtime() {
        assert!(is_trimmed("vramscope::alloc::CachingAllocator::alloc"));
        assert!(is_trimmed("<alloc::vec::Vec<T> as core::ops::Drop>::drop"));
        assert!(is_trimmed("std::rt::lang_start"));
        assert!(!is_trimmed("my_model::train_step"));
        assert!(!is_trimmed("allocator_tests::leaky"));
        let std_shim = Frame {
            function: "<&dyn core::ops::function::Fn<()> as core::ops::function::FnOnce<()>>::call_once".into(),
            file: Some("/rustc/abc/library/core/src/ops/function.rs".into()),
            line: Some(287),
        };
        assert!(is_captures_own(&std_shim));
        assert!(is_captures_own(&Frame { function: "main".into(), file: None, line: None }));
        assert!(!is_captures_own(&Frame { function: "main".into(), file: Some("src/main.rs".into()), line: Some(3) }));
        assert!(is_harness("vramscope::testing::call_body", None));
        assert!(!is_harness("my_tests::leaky::{{closure}}", Some("tests/leaky.rs")));
    }

    fn frame(function: &str, file: Option<&str>, line: Option<u32>) -> Frame {
        Frame { function: function.into(), file: file.map(Into::into), line }
    }

    /// A stack as PyTorch records it by default: C++ first, Python frames among the
    /// interpreter's, the program's line inside the library's.
    #[test]
    fn the_program_line_of_a_default_pytorch_stack() {
        let stack = [
            frame("torch::unwind::unwind()", None, None),
            frame(
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long)",
                Some("CUDACachingAllocator.cpp"),
                None,
            ),
            frame("bool at::cuda::blas::gemm_and_bias<float, float>(bool, bool)", None, None),
            frame("at::_ops::linear::call(at::Tensor const&)", None, None),
            frame("_PyEval_EvalFrameDefault", None, None),
            frame("forward", Some("/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py"), Some(134)),
            frame("PyMethod_New", None, None),
            frame("train_step", Some("/work/train.py"), Some(31)),
            frame("__libc_start_main", None, None),
            frame("<module>", Some("/work/train.py"), Some(80)),
        ];
        let program: Vec<_> = program_frames(stack.iter()).map(|f| f.line).collect();
        assert_eq!(program, [Some(31), Some(80)]);
        let kept: Vec<_> = stack.iter().filter(|f| !is_unwinding_or_interpreter(f)).map(|f| &f.function).collect();
        assert!(!kept.iter().any(|f| f.contains("unwind") || f.starts_with("_PyEval") || f.contains("libc")));
        assert!(kept.iter().any(|f| f.starts_with("at::_ops::linear")), "the operator stays: {kept:?}");
    }

    /// Without Python frames: PyTorch's and the C++ library's namespaces and the runtime are
    /// left out, Rust and other C++ code is the program's (a crate named `flat` is not `at`).
    #[test]
    fn native_stacks_keep_the_programs_own_code() {
        let stack = [
            frame("c10::cuda::CUDACachingAllocator::malloc(void**)", None, None),
            frame("void std::__invoke_impl<void>(int)", None, None),
            frame("flat::alloc_buffer", Some("src/flat.rs"), Some(3)),
            frame("my_server::handle(Request const&)", None, None),
            frame("__libc_start_main", None, None),
        ];
        let program: Vec<_> = program_frames(stack.iter()).map(|f| f.function.as_str()).collect();
        assert_eq!(program, ["flat::alloc_buffer", "my_server::handle(Request const&)"]);
        // What stands for a frame in a build without line tables is the program's.
        let inlined = [frame(INLINED_TEST_BODY, None, None), frame("__clone", None, None)];
        assert_eq!(program_frames(inlined.iter()).count(), 1);
        let rust = [frame("<T as core::ops::Fn>::call", None, None), frame("user::main", Some("src/main.rs"), Some(9))];
        assert_eq!(program_frames(rust.iter()).count(), 2, "Rust paths are never PyTorch's");
    }

    /// Thousands of patterns decide as a plain search over each would: the longest match of
    /// either kind, in the function or the file.
    #[test]
    fn many_patterns_decide_as_each_alone_would() {
        let library: Vec<String> = (0..21_000).map(|i| format!("{i:x}/")).collect();
        let policy = FramePolicy::new(["src/app/"], library.clone()).unwrap();
        for (file, function, expected) in [
            ("src/app/model.rs", "app::f", Some(Said::Program)),
            ("deps/5207/x.rs", "x::f", Some(Said::Library)), // `5207/` (20999)
            ("src/ab/x.rs", "x::g", Some(Said::Library)),    // `ab/`
            ("src/app/ab/x.rs", "x::g", Some(Said::Program)), // `src/app/` is the longer
            ("lib.rs", "zz::h", None),
        ] {
            let f = frame(function, Some(file), Some(1));
            assert_eq!(policy.said(&f), expected, "{file}");
            let plain = |patterns: &[String]| {
                patterns
                    .iter()
                    .filter(|p| file.contains(p.as_str()) || function.contains(p.as_str()))
                    .map(String::len)
                    .max()
            };
            let by_plain = match (plain(&["src/app/".to_string()]), plain(&library)) {
                (Some(u), Some(l)) if l > u => Some(Said::Library),
                (Some(_), _) => Some(Said::Program),
                (None, Some(_)) => Some(Said::Library),
                (None, None) => None,
            };
            assert_eq!(policy.said(&f), by_plain, "{file}");
        }
    }

    /// The user's patterns come first; the longer of two that match decides.
    #[test]
    fn the_users_patterns_decide_first() {
        let p = FramePolicy::new(["vendor/ours/", "installed_pkg/"], ["vendor/"]).unwrap();
        let f = |file: &str| frame("f", Some(file), Some(1));
        assert_eq!(p.said(&f("src/vendor/zlib/a.rs")), Some(Said::Library));
        assert_eq!(p.said(&f("src/vendor/ours/a.rs")), Some(Said::Program));
        assert_eq!(p.said(&f("/venv/site-packages/installed_pkg/m.py")), Some(Said::Program));
        assert_eq!(p.said(&f("src/main.rs")), None);
        let q = FramePolicy::new(["x"], ["x"]).unwrap();
        assert_eq!(q.said(&f("x.rs")), Some(Said::Program), "a tie is the program's");
        let by_name = FramePolicy::new([] as [&str; 0], ["helpers::"]).unwrap();
        assert_eq!(by_name.said(&frame("helpers::alloc_buffer", None, None)), Some(Said::Library));
        for (u, l) in [(vec![""], vec![]), (vec![], vec!["  "])] {
            let e = FramePolicy::new(u, l).unwrap_err().to_string();
            assert!(e.contains("would match every frame"), "{e}");
        }
    }

    /// Autograd's backward thread: PyTorch's C++ only, down to the thread's start. No frame is
    /// the program's; the operator names the allocation.
    #[test]
    fn a_backward_thread_is_named_by_its_operator() {
        let stack = [
            frame(
                "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
                None,
                None,
            ),
            frame("at::_ops::mm::redispatch(c10::DispatchKeySet, at::Tensor const&)", None, None),
            frame("at::_ops::mm::call(at::Tensor const&, at::Tensor const&)", None, None),
            frame(
                "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
                None,
                None,
            ),
            frame("std::error_code::default_error_condition() const", None, None),
            frame("pthread_condattr_setpshared", None, None),
            frame("__clone", None, None),
        ];
        assert_eq!(program_frames(stack.iter()).count(), 0);
        assert_eq!(framework_op(stack.iter()).map(|f| f.function.as_str()), Some(stack[2].function.as_str()));
    }
}
