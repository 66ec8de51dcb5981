//! Leak assertions for test suites: the harness behind `#[gpu_mem_test]`, usable directly in
//! custom harnesses, and the report `assert_mem_snapshot!` pins.
//!
//! ```
//! use vramscope::testing::MemTest;
//! let alloc = vramscope::device(0);
//! let mut kept = Vec::new();
//! let verdict = MemTest::new("doc::leaky").iters(4).warmup(1).check(|| {
//!     let s = alloc.default_stream();
//!     let tmp = alloc.alloc::<f32>(&s, 1024).unwrap();
//!     kept.push(alloc.alloc::<f32>(&s, 256).unwrap()); // survives every iteration
//!     drop(tmp);
//! });
//! assert!(!verdict.passed);
//! assert_eq!(verdict.per_iteration.len(), 5);
//! assert!(verdict.report.contains("doc::leaky"));
//! ```

mod evidence;
mod select;

use crate::alloc::CachingAllocator;
use crate::error::Result;
use crate::report::{self, LiveGroup};
use crate::snapshot::Snapshot;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Memory tests running now, and memory tests ever started: a test that started with none
/// running and saw none start before it ended ran alone.
static RUNNING: AtomicUsize = AtomicUsize::new(0);
static STARTED: AtomicU64 = AtomicU64::new(0);

/// What a memory test measures at the end of each iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Metric {
    /// Bytes the test's live blocks asked for (the default): the figure each line of a
    /// failure report shows, and the one [`MemTest::tolerance`] is compared with. Block sizes
    /// (rounded up to 512 B) stand beside it in the report where they differ.
    LiveBytes,
    /// Number of live blocks the test allocated.
    LiveBlocks,
    /// Bytes the whole allocator reserves (not attributable to one test: use it alone).
    ReservedBytes,
    /// Bytes this process holds on the test's device as the driver counts them: the
    /// [ledger](crate::ledger)'s total (without a GPU, what its parts count). A failure names
    /// the parts that grew: an allocator, a library's or the program's observed allocations,
    /// the driver's pool, modules, or memory not explained. It counts the whole process: it
    /// is meaningful only while no other test uses the device, and the report says when
    /// memory tests overlapped.
    DeviceBytes,
}

impl Metric {
    /// Whether the metric counts the whole process rather than the test's blocks.
    fn whole_process(self) -> bool {
        matches!(self, Metric::ReservedBytes | Metric::DeviceBytes)
    }
}

/// Which backend a memory test needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendRequirement {
    /// Whatever `vramscope::device(n)` provides (the default).
    Any,
    /// The host backend.
    Host,
    /// A CUDA device; the test is skipped, with a printed reason, where there is none.
    Cuda,
}

/// Whose memory a memory test counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Source {
    /// vramscope's allocators (the default devices and those the body builds), and the CUDA
    /// allocations observed by the `observe` module (feature `cupti`) if something started it.
    #[default]
    Vramscope,
    /// Also every CUDA allocation of the process (cudarc, candle, cuBLAS): the test starts the
    /// observer of CUDA allocations (Cargo feature `cupti`), and is skipped, with a printed
    /// reason, where it cannot (no CUPTI, no driver, or a build without the feature).
    Cuda,
}

/// What a test body returns: `()` or a `Result`, whose error stops the iterations.
pub trait Outcome {
    /// Whether the iteration failed on its own.
    fn is_failure(&self) -> bool;
    /// The value returned when the test is skipped.
    fn skipped() -> Self;
}

impl Outcome for () {
    fn is_failure(&self) -> bool {
        false
    }
    fn skipped() -> Self {}
}

impl<T: Default, E> Outcome for std::result::Result<T, E> {
    fn is_failure(&self) -> bool {
        self.is_err()
    }
    fn skipped() -> Self {
        Ok(T::default())
    }
}

/// The outcome of a memory test.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Verdict {
    /// The test's name.
    pub name: String,
    /// Whether growth stayed within the tolerance.
    pub passed: bool,
    /// The metric at the end of each iteration, warm-up included.
    pub per_iteration: Vec<u64>,
    /// Growth of the metric from the end of warm-up to the end of the last iteration.
    pub growth: i64,
    /// Allocations the body made inside the test's scope, in every allocator (freed ones too).
    pub allocations: u64,
    /// Growth of live memory outside the test's scope, in the allocators the body allocated in,
    /// where the test ran alone (no other memory test overlapped it) so that it can be told
    /// apart from a neighbour's.
    pub unattributed_growth: Option<i64>,
    /// The full text report (per-iteration figures and the sites that grew).
    pub report: String,
    /// Files written as evidence (on failure).
    pub evidence: Vec<PathBuf>,
}

/// A memory test: runs a body for warm-up plus measured iterations inside a scope of its own
/// and checks that what the body leaves alive does not grow.
///
/// Only blocks allocated inside the test's scope count, in every allocator alive in the
/// process ([`CachingAllocator::all`]): the default devices and the allocators the body builds.
/// Tests running in parallel threads (as under `cargo test`) never change each other's
/// verdicts. Threads the body spawns count when they enter the test's scope:
/// `let s = vramscope::current_scope();` before spawning, `let _g = s.enter();` in the thread;
/// async tasks count when wrapped: `tokio::spawn(s.wrap(task))`.
#[derive(Debug, Clone)]
pub struct MemTest {
    name: String,
    iters: usize,
    warmup: usize,
    tolerance: u64,
    metric: Metric,
    device: usize,
    backend: BackendRequirement,
    source: Source,
    evidence_dir: Option<PathBuf>,
}

impl MemTest {
    /// A test named `name` (used in reports and for the evidence folder), with 5 measured
    /// iterations, 1 warm-up, no tolerance, live bytes, device 0, any backend.
    pub fn new(name: impl Into<String>) -> Self {
        MemTest {
            name: name.into(),
            iters: 5,
            warmup: 1,
            tolerance: 0,
            metric: Metric::LiveBytes,
            device: 0,
            backend: BackendRequirement::Any,
            source: Source::Vramscope,
            evidence_dir: None,
        }
    }

    /// Measured iterations (at least 1; with the warm-up at most [`MAX_ITERATIONS`], else the
    /// test is an error saying so).
    pub fn iters(mut self, n: usize) -> Self {
        self.iters = n.max(1);
        self
    }

    /// Warm-up iterations, run before the baseline is taken.
    pub fn warmup(mut self, n: usize) -> Self {
        self.warmup = n;
        self
    }

    /// Growth allowed, in the metric's unit: bytes asked for with [`Metric::LiveBytes`] (not
    /// the rounded block sizes, so 100 bytes an iteration pass `tolerance(1024)` for 10
    /// iterations, as the report's figures say), blocks with [`Metric::LiveBlocks`].
    pub fn tolerance(mut self, t: u64) -> Self {
        self.tolerance = t;
        self
    }

    /// What to measure.
    pub fn metric(mut self, m: Metric) -> Self {
        self.metric = m;
        self
    }

    /// The device whose backend [`backend`](Self::backend) checks (the test itself counts
    /// every allocator).
    pub fn device(mut self, d: usize) -> Self {
        self.device = d;
        self
    }

    /// Which backend the test needs.
    pub fn backend(mut self, b: BackendRequirement) -> Self {
        self.backend = b;
        self
    }

    /// Whose memory counts: with [`Source::Cuda`], every CUDA allocation of the process
    /// made inside the test's scope, however it was made.
    pub fn source(mut self, s: Source) -> Self {
        self.source = s;
        self
    }

    /// Where evidence goes: `DIR/<test name>/` (default: `target/vramscope/` of the current
    /// directory, or of `CARGO_TARGET_DIR`).
    pub fn evidence_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.evidence_dir = Some(dir.into());
        self
    }

    /// Why the test cannot run here, if it cannot. With [`Source::Cuda`] this starts the
    /// observer of CUDA allocations.
    pub fn skip_reason(&self) -> Option<String> {
        if self.source == Source::Cuda {
            #[cfg(feature = "cupti")]
            if let Err(e) = crate::observe::start() {
                return Some(format!("{}: skipped, CUDA allocations cannot be observed here: {e}", self.name));
            }
            #[cfg(not(feature = "cupti"))]
            return Some(format!(
                "{}: skipped, it observes CUDA allocations and this build has no observer (vramscope's \
                 `cupti` feature)",
                self.name
            ));
        }
        match self.backend {
            #[cfg(not(feature = "cuda-backend"))]
            BackendRequirement::Cuda => Some(format!(
                "{}: skipped, it needs a CUDA device and this build has no CUDA backend (vramscope's `cuda` feature)",
                self.name
            )),
            #[cfg(feature = "cuda-backend")]
            BackendRequirement::Cuda => match crate::try_device(self.device) {
                Ok(a) if a.backend().name() == "cuda" => None,
                Ok(a) => Some(format!(
                    "{}: skipped, it needs a CUDA device and device {} is {} (no CUDA driver or device \
                     was found, or VRAMSCOPE_BACKEND chose another backend)",
                    self.name,
                    self.device,
                    a.backend().name()
                )),
                Err(e) => Some(format!("{}: skipped, device {} could not be opened: {e}", self.name, self.device)),
            },
            BackendRequirement::Host => match crate::try_device(self.device) {
                Ok(a) if a.backend().name() != "host" => Some(format!(
                    "{}: skipped, it needs the host backend and device {} is {}",
                    self.name,
                    self.device,
                    a.backend().name()
                )),
                _ => None,
            },
            BackendRequirement::Any => None,
        }
    }

    /// The test's blocks and the rest, summed over every allocator recording scopes.
    fn measure(&self, scope: crate::Scope) -> Measure {
        let mut m = Measure::default();
        for alloc in CachingAllocator::all() {
            if !alloc.record_config().scopes {
                m.unscoped_allocators += 1;
                continue;
            }
            let (inside, outside, used) = alloc.scope_split(scope);
            m.bytes = m.bytes.saturating_add(inside.requested_bytes);
            m.blocks = m.blocks.saturating_add(inside.blocks);
            // Memory outside the scope counts only in allocators the body used: an allocator
            // it never allocated in serves other code (another test of the binary running
            // beside it, memory test or not), whose growth is not the body's.
            if used {
                m.outside_bytes = m.outside_bytes.saturating_add(outside.requested_bytes);
                m.outside_blocks = m.outside_blocks.saturating_add(outside.blocks);
            }
            if self.metric == Metric::ReservedBytes {
                m.reserved = m.reserved.saturating_add(alloc.memory_reserved());
            }
        }
        if self.metric == Metric::DeviceBytes {
            let l = crate::ledger::take(self.device);
            m.device = l.bytes();
            m.ledger = Some(l);
        }
        m
    }

    fn value(&self, m: &Measure) -> u64 {
        match self.metric {
            Metric::LiveBytes => m.bytes,
            Metric::LiveBlocks => m.blocks,
            Metric::ReservedBytes => m.reserved,
            Metric::DeviceBytes => m.device,
        }
    }

    fn outside_value(&self, m: &Measure) -> u64 {
        match self.metric {
            Metric::LiveBlocks => m.outside_blocks,
            _ => m.outside_bytes,
        }
    }

    /// Runs the body and returns the verdict, and what the last iteration returned (or the first
    /// failing one). Writes evidence when the test fails.
    ///
    /// What counts: blocks allocated inside the test's scope, in every allocator alive in the
    /// process that records scopes (the default devices and the ones the body builds). The
    /// test fails, with a report saying why, when that grows beyond the tolerance; when the
    /// body allocated nothing in any of them (a test that measures nothing proves nothing: it
    /// may allocate through another allocator or a thread that never entered the test's
    /// scope); and when it ran alone (no other memory test overlapped it) and live memory
    /// outside its scope, in the allocators the body allocated in, grew at every measured
    /// iteration (a thread of the body that did not enter its scope). Allocators the body never
    /// used are left out of that count: in a test binary, they serve the tests running beside
    /// it, plain tests included.
    pub fn run<R: Outcome>(&self, mut body: impl FnMut() -> R) -> Result<(Verdict, R)> {
        let runs = self.warmup.checked_add(self.iters).filter(|n| *n <= MAX_ITERATIONS).ok_or_else(|| {
            crate::Error::from(crate::error::UsageError::TooManyIterations {
                test: self.name.clone(),
                warmup: self.warmup,
                iters: self.iters,
                limit: MAX_ITERATIONS,
            })
        })?;
        #[cfg(feature = "cupti")]
        if self.source == Source::Cuda {
            crate::observe::start()?;
        }
        // The scope is named after the test: deterministic, so that pinned reports do not
        // change from run to run; test names are unique within a test binary.
        let guard = crate::scope(&self.name);
        let scope = crate::current_scope();
        let allocations_before = scope.allocations();
        // Counted out by a guard, so that a body that panics (a `#[should_panic]` test) leaves
        // no test counted as running: every later test would otherwise never run alone.
        let running = Running::enter();
        let others_at_start = running.others_at_start;
        let generation = STARTED.fetch_add(1, Ordering::SeqCst) + 1;
        let path = scope.path();
        let alone_so_far = || others_at_start == 0 && STARTED.load(Ordering::SeqCst) == generation;
        let mut measures = Vec::with_capacity(runs + 1);
        let mut before: Option<Vec<Snapshot>> = None;
        if self.warmup == 0 {
            measures.push(self.measure(scope));
            before = Some(self.snapshots(scope, alone_so_far()));
        }
        let mut last = None;
        for i in 0..runs {
            let out = call_body(&mut body);
            let failed = out.is_failure();
            last = Some(out);
            measures.push(self.measure(scope));
            if i + 1 == self.warmup {
                before = Some(self.snapshots(scope, alone_so_far()));
            }
            if failed {
                break;
            }
        }
        drop(guard);
        let alone = alone_so_far();
        drop(running);
        let out = last.expect("at least one iteration ran");
        let allocations = scope.allocations() - allocations_before;
        // With warm-up, `measures[k]` is the end of iteration k + 1; without, `measures[0]` is
        // the start and `measures[k]` the end of iteration k.
        let base_index = self.warmup.saturating_sub(1);
        let baseline = &measures[base_index.min(measures.len() - 1)];
        let end = measures.last().expect("measured at least once");
        let per_iteration: Vec<u64> = measures[usize::from(self.warmup == 0)..].iter().map(|m| self.value(m)).collect();
        // In i128: no pair of u64 figures and tolerance wraps.
        let tolerance = i128::from(self.tolerance);
        let growth = i128::from(self.value(end)) - i128::from(self.value(baseline));
        let measured = &measures[base_index.min(measures.len() - 1)..];
        let unscoped_growth = i128::from(self.outside_value(end)) - i128::from(self.outside_value(baseline));
        let unattributed = alone
            && !self.metric.whole_process()
            && measured.len() > 1
            && unscoped_growth > tolerance
            && measured.windows(2).all(|w| self.outside_value(&w[1]) > self.outside_value(&w[0]));
        let nothing = allocations == 0 && !self.metric.whole_process();
        let grew = growth > tolerance;
        let clamp = |g: i128| g.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        let (growth, unscoped_growth) = (clamp(growth), clamp(unscoped_growth));
        let passed = out.is_failure() || !(grew || unattributed || nothing);
        let mut verdict = Verdict {
            name: self.name.clone(),
            passed,
            per_iteration,
            growth,
            allocations,
            unattributed_growth: if alone { Some(unscoped_growth) } else { None },
            report: String::new(),
            evidence: Vec::new(),
        };
        if passed {
            verdict.report = format!("{}: no growth beyond the tolerance", self.name);
            return Ok((verdict, out));
        }
        let outside_per_iteration =
            measures[usize::from(self.warmup == 0)..].iter().map(|m| self.outside_value(m)).collect();
        let start = (self.warmup == 0).then(|| &measures[0]);
        let failure = Failure {
            grew,
            unattributed,
            nothing,
            unscoped_allocators: end.unscoped_allocators,
            unscoped_growth,
            outside_per_iteration,
            start: start.map(|m| self.value(m)),
            outside_start: start.map(|m| self.outside_value(m)),
            ledgers: baseline.ledger.clone().zip(end.ledger.clone()),
            alone,
        };
        let after = self.snapshots(scope, alone);
        let before = before.unwrap_or_default();
        // The device's ledger at the end goes with the evidence: the one the last measure took
        // where the metric counts the device, else one taken now.
        let ledger = end.ledger.clone().unwrap_or_else(|| crate::ledger::take(self.device));
        let ev = evidence::Evidence::new(&path, &before, &after, ledger);
        verdict.report = ev.report(self, &verdict, &failure);
        let (written, problem) = ev.write(self, &verdict);
        verdict.evidence = written;
        if let Some(problem) = problem {
            verdict.report.push_str(&format!("\nevidence not written: {problem}\n"));
        }
        if !verdict.evidence.is_empty() {
            verdict.report.push_str("\nevidence:\n");
            for p in &verdict.evidence {
                verdict.report.push_str(&format!("  {}\n", p.display()));
            }
        }
        Ok((verdict, out))
    }

    /// Snapshots of the allocators that hold blocks of the test (or, when `everything`, any
    /// live block), for the reports.
    fn snapshots(&self, scope: crate::Scope, everything: bool) -> Vec<Snapshot> {
        CachingAllocator::all()
            .into_iter()
            .filter(|a| {
                let (inside, outside, used) = a.scope_split(scope);
                inside.blocks > 0 || (everything && used && outside.blocks > 0)
            })
            .map(|a| a.snapshot())
            .collect()
    }

    /// Like [`run`](Self::run), returning the verdict only.
    pub fn check<R: Outcome>(&self, body: impl FnMut() -> R) -> Verdict {
        match self.run(body) {
            Ok((v, _)) => v,
            Err(e) => Verdict {
                name: self.name.clone(),
                passed: false,
                per_iteration: Vec::new(),
                growth: 0,
                allocations: 0,
                unattributed_growth: None,
                report: e.to_string(),
                evidence: Vec::new(),
            },
        }
    }

    /// What `#[gpu_mem_test]` calls: skips with a printed reason where the backend is missing,
    /// runs the body, and panics with the report (after writing the evidence) when memory grew.
    /// The panic is located at the caller, the user's test.
    #[doc(hidden)]
    #[track_caller]
    pub fn run_test<R: Outcome>(&self, body: impl FnMut() -> R) -> R {
        if let Some(reason) = self.skip_reason() {
            eprintln!("{reason}");
            return R::skipped();
        }
        match self.run(body) {
            Ok((v, out)) if v.passed => out,
            Ok((v, _)) => panic!("{}", v.report),
            Err(e) => panic!("{}: {e}", self.name),
        }
    }

    /// The live-tensor report of what the test left alive (its scope, in every allocator, on
    /// the calling thread's current scope), with the test's own scope left out of the paths:
    /// what `snapshot = true` pins after the iterations.
    #[doc(hidden)]
    pub fn scope_report(&self) -> String {
        snapshot_report(self)
    }

    /// The test's scope path as seen from the calling thread (outside the test's own scope).
    fn scope_path(&self) -> Vec<String> {
        let mut path = crate::current_scope().path();
        path.push(self.name.clone());
        path
    }
}

/// One memory test counted in [`RUNNING`] while it lives, however its body ends.
struct Running {
    others_at_start: usize,
}

impl Running {
    fn enter() -> Running {
        Running { others_at_start: RUNNING.fetch_add(1, Ordering::SeqCst) }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Calls a test body: the frame at which recorded stacks stop, so that reports show the body's
/// frames and not the harness's or the test runner's.
#[inline(never)]
fn call_body<R>(body: &mut impl FnMut() -> R) -> R {
    let r = body();
    std::hint::black_box(r)
}

/// The most iterations (warm-up and measured) a memory test runs: a bound that keeps a typo
/// (`iters = 1000000000000`) an error rather than a test binary that runs out of memory.
pub const MAX_ITERATIONS: usize = 1_000_000;

/// The iterations a memory test of `warmup` warm-up and `iters` measured iterations runs in
/// all: at least one measured, at most [`MAX_ITERATIONS`] in all; else what is wrong.
/// `#[gpu_mem_test]` calls it in a constant, so that a count out of range fails the build at
/// the attribute, by this one bound.
#[doc(hidden)]
pub const fn checked_iterations(warmup: u64, iters: u64) -> std::result::Result<usize, &'static str> {
    if iters == 0 {
        return Err("`iters` takes at least 1: a memory test measures one iteration or more");
    }
    match warmup.checked_add(iters) {
        Some(n) if n <= MAX_ITERATIONS as u64 => Ok(n as usize),
        // The figure is MAX_ITERATIONS (a constant's value cannot be formatted in a constant;
        // a unit test keeps the two equal).
        _ => Err("`warmup` + `iters` is more than 1,000,000 iterations (vramscope::testing::MAX_ITERATIONS)"),
    }
}

/// What one measurement saw, summed over allocators.
#[derive(Debug, Default, Clone)]
struct Measure {
    /// Bytes asked for (not block sizes): what the report prints.
    bytes: u64,
    blocks: u64,
    outside_bytes: u64,
    outside_blocks: u64,
    reserved: u64,
    /// The device's bytes and its ledger ([`Metric::DeviceBytes`] only).
    device: u64,
    ledger: Option<crate::ledger::Ledger>,
    /// Allocators that record no scopes: their blocks cannot be told apart.
    unscoped_allocators: usize,
}

/// Why a test failed.
struct Failure {
    grew: bool,
    unattributed: bool,
    nothing: bool,
    unscoped_allocators: usize,
    unscoped_growth: i64,
    /// The metric over the blocks outside the test's scope, as `Verdict::per_iteration`.
    outside_per_iteration: Vec<u64>,
    /// The metric at the start, before the first iteration, where no warm-up ran (then the
    /// baseline): the test's blocks, and those outside its scope.
    start: Option<u64>,
    outside_start: Option<u64>,
    /// The device's ledger at the baseline and at the end ([`Metric::DeviceBytes`]).
    ledgers: Option<(crate::ledger::Ledger, crate::ledger::Ledger)>,
    /// Whether no other memory test overlapped this one.
    alone: bool,
}

/// The evidence folder's name for a test: its name with every character other than ASCII
/// letters, digits, `_`, `-` and `.` made `_` (`leaks::a_test` is `leaks__a_test`). Where that
/// loses more than the `::` of a path (letters outside ASCII, spaces), would name no folder of
/// its own (empty, `.`, `..`), or passes 200 bytes, a hash of the whole name follows, so that
/// two tests never share a folder and a name never leaves the evidence folder.
fn sanitize(name: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.';
    let mut out: String = name.chars().map(|c| if safe(c) { c } else { '_' }).collect();
    let lossy = name.chars().any(|c| !safe(c) && c != ':');
    if lossy || out.chars().all(|c| c == '.') || out.len() > 200 {
        // FNV-1a: stable across runs and builds, unlike the standard library's hasher.
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        out.truncate(180);
        out = format!("{out}-{hash:016x}");
    }
    out
}

/// The deterministic live-tensor report `assert_mem_snapshot!` pins: sites, scopes, dtypes,
/// shapes, counts and bytes; no addresses, timestamps or thread ids; stable order.
pub fn snapshot_report(source: &impl SnapshotSource) -> String {
    LiveGroup::render(&report::live(&source.take_snapshot()))
}

/// What `assert_mem_snapshot!` accepts: an allocator (all its live blocks, whoever allocated
/// them: pin a private allocator this way, not a shared one such as `device(0)` that tests
/// running beside yours also use), a snapshot, or a [`MemTest`] (the blocks the test keeps
/// alive, in every allocator, and nothing else: stable under parallel tests).
pub trait SnapshotSource {
    /// The snapshot to report on.
    fn take_snapshot(&self) -> Snapshot;
}

impl SnapshotSource for CachingAllocator {
    fn take_snapshot(&self) -> Snapshot {
        self.snapshot()
    }
}

impl SnapshotSource for Snapshot {
    fn take_snapshot(&self) -> Snapshot {
        self.clone()
    }
}

/// The blocks the test keeps alive (its scope, as seen from the calling thread, in every
/// allocator), with the test's own scope left out of the paths and sites named by `file:line`
/// alone where line tables exist, so that a pin reads the same in every profile.
impl SnapshotSource for MemTest {
    fn take_snapshot(&self) -> Snapshot {
        let path = self.scope_path();
        let snaps: Vec<Snapshot> = CachingAllocator::all()
            .into_iter()
            .map(|a| select::within(&a.snapshot(), &path, true))
            .filter(|s| s.live_blocks().next().is_some())
            .collect();
        let mut snap = select::merge(snaps).unwrap_or_else(|| Snapshot::empty("none"));
        select::strip_scope(&mut snap, &path);
        // Lines, not function names, where lines are known: the names of inlined code differ
        // between the dev and release profiles (`f::{{closure}}` and `{closure#0}`), lines do not.
        for f in &mut snap.frames {
            if f.file.is_some() && f.line.is_some() {
                f.function.clear();
            }
        }
        snap
    }
}

/// Pins the live tensors of a memory test, an allocator or a snapshot with `insta` (see
/// [`SnapshotSource`] for what each covers: a `MemTest` pins only
/// its own blocks, an allocator all of its blocks): the snapshot file lands beside the calling
/// test, as with `insta::assert_snapshot!`. The report is deterministic (see
/// [`testing::snapshot_report`](crate::testing::snapshot_report)), so a change in what a step
/// keeps alive shows up as a reviewable diff. Take it once per test, after the work.
///
/// ```
/// let alloc = vramscope::CachingAllocator::new(vramscope::backend::HostBackend::new(1 << 30));
/// let _s = vramscope::scope("model");
/// let w = alloc.alloc::<f32>(&alloc.default_stream(), 1024).unwrap().with_shape(&[32, 32]).unwrap();
/// let report = vramscope::testing::snapshot_report(&alloc);
/// assert!(report.contains("[model] float32[32, 32]"));
/// // In a test: vramscope::assert_mem_snapshot!(alloc);
/// # drop(w);
/// ```
#[macro_export]
macro_rules! assert_mem_snapshot {
    ($source:expr $(,)?) => {
        $crate::__macro_support::insta::assert_snapshot!($crate::testing::snapshot_report(&$source))
    };
    ($name:expr, $source:expr $(,)?) => {
        $crate::__macro_support::insta::assert_snapshot!($name, $crate::testing::snapshot_report(&$source))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evidence_folders_are_one_per_test_and_inside_the_evidence_folder() {
        assert_eq!(sanitize("leaks::a_forgotten_buffer"), "leaks__a_forgotten_buffer");
        // Names that differ only in letters outside ASCII get folders of their own.
        let (a, b) = (sanitize("tests::größe"), sanitize("tests::grüße"));
        assert_ne!(a, b);
        assert!(a.starts_with("tests__gr__e-"), "{a}");
        // No name reaches outside the evidence folder or names the folder itself.
        for name in ["..", ".", "", "../../etc", "a/b"] {
            let s = sanitize(name);
            assert!(!s.is_empty() && !s.chars().all(|c| c == '.') && !s.contains('/'), "{name:?} -> {s:?}");
        }
        assert_ne!(sanitize(".."), sanitize("."));
        let long = "x".repeat(300);
        assert!(sanitize(&long).len() <= 200);
        assert_ne!(sanitize(&long), sanitize(&"x".repeat(301)));
    }

    #[test]
    fn iteration_counts_are_checked_by_the_one_bound() {
        assert_eq!(checked_iterations(1, 5), Ok(6));
        assert_eq!(checked_iterations(0, MAX_ITERATIONS as u64), Ok(MAX_ITERATIONS));
        assert!(checked_iterations(0, 0).unwrap_err().contains("at least 1"));
        assert!(checked_iterations(u64::MAX, 1).is_err());
        let over = checked_iterations(1, MAX_ITERATIONS as u64).unwrap_err();
        // The message's figure is the constant's.
        let figure = crate::error::fmt_bytes_exact(MAX_ITERATIONS as u64);
        assert!(over.contains(&format!("{} iterations", figure.trim_end_matches(" B"))), "{over}");
    }
}
