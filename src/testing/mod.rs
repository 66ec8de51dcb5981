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

use crate::alloc::CachingAllocator;
use crate::error::{fmt_bytes, Error, Result};
use crate::report::{self, FoldedKind, LiveGroup};
use crate::snapshot::{BlockState, Snapshot};
use std::path::PathBuf;

/// What a memory test measures at the end of each iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Metric {
    /// Bytes of live blocks the test allocated (the default).
    LiveBytes,
    /// Number of live blocks the test allocated.
    LiveBlocks,
    /// Bytes the whole allocator reserves (not attributable to one test: use it alone).
    ReservedBytes,
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
    /// The full text report (per-iteration figures and the sites that grew).
    pub report: String,
    /// Files written as evidence (on failure).
    pub evidence: Vec<PathBuf>,
}

/// A memory test: runs a body for warm-up plus measured iterations inside a scope of its own
/// and checks that what the body leaves alive does not grow.
///
/// Only blocks allocated inside the test's scope count, so tests running in parallel threads
/// (as under `cargo test`) never change each other's verdicts. Threads the body spawns count
/// when they enter the test's scope: `let s = vramscope::current_scope();` before spawning,
/// `let _g = s.enter();` in the thread.
#[derive(Debug, Clone)]
pub struct MemTest {
    name: String,
    iters: usize,
    warmup: usize,
    tolerance: u64,
    metric: Metric,
    device: usize,
    backend: BackendRequirement,
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
            evidence_dir: None,
        }
    }

    /// Measured iterations (at least 1).
    pub fn iters(mut self, n: usize) -> Self {
        self.iters = n.max(1);
        self
    }

    /// Warm-up iterations, run before the baseline is taken.
    pub fn warmup(mut self, n: usize) -> Self {
        self.warmup = n;
        self
    }

    /// Growth allowed, in the metric's unit.
    pub fn tolerance(mut self, t: u64) -> Self {
        self.tolerance = t;
        self
    }

    /// What to measure.
    pub fn metric(mut self, m: Metric) -> Self {
        self.metric = m;
        self
    }

    /// Which device's process-wide allocator the body uses.
    pub fn device(mut self, d: usize) -> Self {
        self.device = d;
        self
    }

    /// Which backend the test needs.
    pub fn backend(mut self, b: BackendRequirement) -> Self {
        self.backend = b;
        self
    }

    /// Where evidence goes: `DIR/<test name>/` (default: `target/vramscope/` of the current
    /// directory, or of `CARGO_TARGET_DIR`).
    pub fn evidence_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.evidence_dir = Some(dir.into());
        self
    }

    /// Why the test cannot run here, if it cannot.
    pub fn skip_reason(&self) -> Option<String> {
        match self.backend {
            BackendRequirement::Cuda => {
                Some(format!("{}: skipped, it needs a CUDA device and this build has no CUDA backend", self.name))
            }
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

    fn measure(&self, alloc: &CachingAllocator, scope: crate::Scope) -> u64 {
        let _ = alloc.synchronize_all();
        match self.metric {
            Metric::LiveBytes => alloc.scope_usage(scope).bytes,
            Metric::LiveBlocks => alloc.scope_usage(scope).blocks,
            Metric::ReservedBytes => alloc.memory_reserved(),
        }
    }

    /// Runs the body and returns the verdict, and what the last iteration returned (or the first
    /// failing one). Writes evidence when the test fails.
    pub fn run<R: Outcome>(&self, mut body: impl FnMut() -> R) -> Result<(Verdict, R)> {
        let alloc = crate::try_device(self.device)?;
        if !alloc.record_config().scopes {
            return Err(Error::Usage(format!(
                "{}: memory tests need scopes recorded (RecordConfig::scopes) on device {}",
                self.name, self.device
            )));
        }
        // The scope is named after the test: deterministic, so that pinned reports do not
        // change from run to run; test names are unique within a test binary.
        let guard = crate::scope(&self.name);
        let scope = crate::current_scope();
        let mut per_iteration = Vec::with_capacity(self.warmup + self.iters);
        let mut first: Option<Snapshot> = None;
        let mut last = None;
        for i in 0..self.warmup + self.iters {
            let out = body();
            let failed = out.is_failure();
            last = Some(out);
            per_iteration.push(self.measure(&alloc, scope));
            if i + 1 == self.warmup.max(1) && first.is_none() {
                first = Some(alloc.snapshot());
            }
            if failed {
                break;
            }
        }
        drop(guard);
        let out = last.expect("at least one iteration ran");
        let baseline = if self.warmup == 0 { 0 } else { per_iteration[self.warmup - 1] };
        let end = *per_iteration.last().expect("at least one iteration ran");
        let growth = end as i64 - baseline as i64;
        let passed = out.is_failure() || growth <= self.tolerance as i64;
        let mut verdict = Verdict {
            name: self.name.clone(),
            passed,
            per_iteration,
            growth,
            report: String::new(),
            evidence: Vec::new(),
        };
        if passed {
            verdict.report = format!("{}: no growth beyond the tolerance", self.name);
            return Ok((verdict, out));
        }
        let path = scope.path();
        let before = within(first.as_ref().expect("taken after the first warm-up iteration"), &path);
        let after = within(&alloc.snapshot(), &path);
        verdict.report = self.report(&verdict, &before, &after);
        verdict.evidence = self.write_evidence(&verdict.report, &before, &after);
        if !verdict.evidence.is_empty() {
            verdict.report.push_str("evidence:\n");
            for p in &verdict.evidence {
                verdict.report.push_str(&format!("  {}\n", p.display()));
            }
        }
        Ok((verdict, out))
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
                report: e.to_string(),
                evidence: Vec::new(),
            },
        }
    }

    /// What `#[gpu_mem_test]` calls: skips with a printed reason where the backend is missing,
    /// runs the body, and panics with the report (after writing the evidence) when memory grew.
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

    /// The live-tensor report of what the test left alive (its scope, on the calling thread's
    /// current scope), with the test's own scope left out of the paths: what `snapshot = true`
    /// pins after the iterations.
    pub fn scope_report(&self) -> String {
        let Ok(alloc) = crate::try_device(self.device) else { return String::new() };
        let mut path = crate::current_scope().path();
        path.push(self.name.clone());
        let mut snap = within(&alloc.snapshot(), &path);
        for p in &mut snap.scopes {
            if p.starts_with(&path) {
                p.drain(..path.len());
            }
        }
        LiveGroup::render(&report::live(&snap))
    }

    fn unit(&self, v: u64) -> String {
        match self.metric {
            Metric::LiveBlocks => format!("{v} blocks"),
            _ => fmt_bytes(v),
        }
    }

    fn report(&self, v: &Verdict, before: &Snapshot, after: &Snapshot) -> String {
        let metric = match self.metric {
            Metric::LiveBytes => "live bytes",
            Metric::LiveBlocks => "live blocks",
            Metric::ReservedBytes => "reserved bytes",
        };
        let mut s = format!(
            "{}: {metric} grew by {} over {} iterations after {} warm-up (tolerance {})\n",
            self.name,
            self.unit(v.growth.max(0) as u64),
            self.iters,
            self.warmup,
            self.unit(self.tolerance)
        );
        s.push_str("per iteration:");
        for (i, x) in v.per_iteration.iter().enumerate() {
            let tag = if i < self.warmup { " (warm-up)" } else { "" };
            s.push_str(&format!("\n  {:>3}: {}{tag}", i + 1, self.unit(*x)));
        }
        s.push_str("\nallocation sites that grew:\n");
        let measured = self.iters.max(1) as u64;
        let grown = report::diff(before, after);
        let groups = report::live(after);
        let mut any = false;
        for d in grown.iter().filter(|d| d.after > d.before) {
            any = true;
            let group = groups.iter().find(|g| g.site == d.site && g.scope == d.scope).cloned();
            let tensor = group.and_then(|g: LiveGroup| {
                g.dtype.map(|t| format!(" {t}{}", g.shape.map_or(String::new(), |sh| format!("{sh:?}"))))
            });
            s.push_str(&format!(
                "  {}\n      scope {}{}\n      +{} blocks, +{} per iteration ({} -> {} live)\n",
                d.site,
                if d.scope.is_empty() { "-" } else { &d.scope },
                tensor.unwrap_or_default(),
                d.count_after.saturating_sub(d.count_before) / measured,
                fmt_bytes((d.after - d.before) / measured),
                fmt_bytes(d.before),
                fmt_bytes(d.after)
            ));
        }
        if !any {
            s.push_str("  (none attributable: the growth is in memory outside the test's blocks)\n");
        }
        s
    }

    fn write_evidence(&self, text: &str, before: &Snapshot, after: &Snapshot) -> Vec<PathBuf> {
        let root = self.evidence_dir.clone().unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("target"))
                .join("vramscope")
        });
        let dir = root.join(sanitize(&self.name));
        if std::fs::create_dir_all(&dir).is_err() {
            return Vec::new();
        }
        let live = report::folded(after, FoldedKind::Live);
        let mut files: Vec<(&str, Vec<u8>)> =
            vec![("report.txt", text.as_bytes().to_vec()), ("snapshot.json", after.to_json().into_bytes())];
        if let Ok(svg) = report::flamegraph(&live, &format!("{}: live memory after the last iteration", self.name)) {
            files.push(("live.svg", svg.into_bytes()));
        }
        if let Ok(svg) = report::differential_flamegraph(
            &report::folded(before, FoldedKind::Live),
            &live,
            &format!("{}: growth from the first to the last iteration", self.name),
        ) {
            files.push(("growth.svg", svg.into_bytes()));
        }
        files
            .into_iter()
            .filter_map(|(name, bytes)| {
                let p = dir.join(name);
                std::fs::write(&p, bytes).ok().map(|_| p)
            })
            .collect()
    }
}

/// The snapshot with only the blocks (and history) of contexts inside scope `path`.
fn within(snap: &Snapshot, path: &[String]) -> Snapshot {
    let inside = |c: Option<&crate::snapshot::ContextInfo>| {
        c.and_then(|c| snap.scopes.get(c.scope as usize)).is_some_and(|p| p.starts_with(path))
    };
    let mut s = snap.clone();
    for seg in &mut s.segments {
        seg.blocks.retain(|b| b.state != BlockState::ActiveAllocated || inside(b.context.as_ref()));
    }
    s.history.retain(|e| inside(e.context.as_ref()));
    s
}

/// A file-name-safe version of a test name.
fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' { c } else { '_' }).collect()
}

/// The deterministic live-tensor report `assert_mem_snapshot!` pins: sites, scopes, dtypes,
/// shapes, counts and bytes; no addresses, timestamps or thread ids; stable order.
pub fn snapshot_report(source: &impl SnapshotSource) -> String {
    LiveGroup::render(&report::live(&source.take_snapshot()))
}

/// What `assert_mem_snapshot!` accepts: an allocator or a snapshot.
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

/// Pins the live tensors of an allocator (or a snapshot) with `insta`: the snapshot file lands
/// beside the calling test, as with `insta::assert_snapshot!`. The report is deterministic (see
/// [`testing::snapshot_report`](crate::testing::snapshot_report)), so a change in what a step
/// keeps alive shows up as a reviewable diff. Take it once per test, after the work.
///
/// ```
/// let alloc = vramscope::CachingAllocator::new(vramscope::HostBackend::new(1 << 30));
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
        $crate::__insta::assert_snapshot!($crate::testing::snapshot_report(&$source))
    };
    ($name:expr, $source:expr $(,)?) => {
        $crate::__insta::assert_snapshot!($name, $crate::testing::snapshot_report(&$source))
    };
}
