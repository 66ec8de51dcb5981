//! What a failed memory test says and writes: the report naming each line that kept memory,
//! with exact bytes, and the files under `target/vramscope/<test>/`.

use super::select::{merge, within};
use super::{sanitize, Failure, MemTest, Metric, Verdict};
use crate::error::{fmt_bytes, fmt_bytes_exact as exact};
use crate::ledger::Ledger;
use crate::report::{self, plural, FoldedKind};
use crate::snapshot::Snapshot;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

/// The test's blocks at the baseline and at the end, and (where the test ran alone) the blocks
/// outside its scope, each merged over allocators.
pub(super) struct Evidence {
    path: Vec<String>,
    before: Snapshot,
    after: Snapshot,
    outside_before: Snapshot,
    outside_after: Snapshot,
}

/// Exact bytes, with the rounded figure beside them where it reads easier: `262,144 B (256.00 KiB)`.
fn exact_and_round(n: u64) -> String {
    if n < 1024 {
        exact(n)
    } else {
        format!("{} ({})", exact(n), fmt_bytes(n))
    }
}

/// What one allocation site (and scope) holds in one snapshot.
#[derive(Default, Clone)]
struct Tally {
    blocks: u64,
    bytes: u64,
    requested: u64,
    /// Each block's size.
    sizes: Vec<u64>,
    tensors: BTreeSet<String>,
}

/// Live blocks grouped by the line that allocated them (the site table every report groups
/// by) and their scope below `path`.
fn tally(snap: &Snapshot, path: &[String]) -> BTreeMap<(String, String), Tally> {
    let mut out: BTreeMap<(String, String), Tally> = BTreeMap::new();
    let mut labels = report::Labels::new(snap);
    let test = path.last().map_or("the test", String::as_str);
    for b in snap.live_blocks() {
        let ctx = b.context.as_ref();
        let id = labels.site(ctx);
        let mut site = labels.site_label(id).to_string();
        if site == crate::frames::INLINED_TEST_BODY {
            site = format!("{test} (its body; no line tables in this build)");
        } else if site == crate::frames::INLINED_ELSEWHERE && !path.is_empty() {
            // Inside the test's scope: the body's code, run by the standard library (a scoped
            // or spawned thread's closure), whose frames a build without line tables folds away.
            site = format!("{test} (a thread or closure of its body; no line tables in this build)");
        }
        let scope = ctx
            .and_then(|c| snap.scope(c.scope))
            .map(|p| if p.starts_with(path) { &p[path.len()..] } else { p })
            .map(|p| p.join("/"))
            .unwrap_or_default();
        let t = out.entry((site, scope)).or_default();
        t.blocks += 1;
        t.bytes += b.size;
        t.requested += b.requested_size;
        t.sizes.push(b.size);
        t.tensors.insert(match (&b.dtype, &b.shape) {
            (Some(d), Some(s)) => format!("{d}{s:?}"),
            (Some(d), None) => d.clone(),
            _ => String::new(),
        });
    }
    out
}

/// A site that holds more at the end than at the baseline.
#[derive(Clone)]
struct Grown {
    site: String,
    scope: String,
    blocks: u64,
    bytes: u64,
    requested: u64,
    /// The sizes of the blocks it holds that it did not hold at the baseline, largest first.
    sizes: Vec<u64>,
    /// The sizes of the blocks it held at the baseline and no longer holds, largest first.
    gone: Vec<u64>,
    tensor: String,
}

/// The blocks of `after` not in `before`, by size (a multiset difference), largest first.
fn new_sizes(mut before: Vec<u64>, mut after: Vec<u64>) -> Vec<u64> {
    before.sort_unstable_by(|a, b| b.cmp(a));
    after.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = Vec::new();
    let mut old = before.into_iter().peekable();
    for size in after {
        while old.next_if(|&o| o > size).is_some() {}
        if old.next_if_eq(&size).is_none() {
            out.push(size);
        }
    }
    out
}

fn grown(before: &Snapshot, after: &Snapshot, path: &[String]) -> Vec<Grown> {
    let b = tally(before, path);
    let mut out: Vec<Grown> = tally(after, path)
        .into_iter()
        .filter_map(|(key, a)| {
            let z = b.get(&key).cloned().unwrap_or_default();
            (a.requested > z.requested || a.bytes > z.bytes || a.blocks > z.blocks).then(|| Grown {
                site: key.0,
                scope: key.1,
                blocks: a.blocks.saturating_sub(z.blocks),
                bytes: a.bytes.saturating_sub(z.bytes),
                requested: a.requested.saturating_sub(z.requested),
                sizes: new_sizes(z.sizes.clone(), a.sizes.clone()),
                gone: new_sizes(a.sizes.clone(), z.sizes),
                tensor: if a.tensors.len() == 1 {
                    a.tensors.into_iter().next().unwrap_or_default()
                } else {
                    String::new()
                },
            })
        })
        .collect();
    out.sort_by(|x, y| {
        y.requested
            .cmp(&x.requested)
            .then_with(|| y.bytes.cmp(&x.bytes))
            .then_with(|| x.site.cmp(&y.site))
            .then_with(|| x.scope.cmp(&y.scope))
    });
    out
}

/// When the metric grew over the measured iterations.
#[derive(Debug, Clone, PartialEq, Eq)]
enum When {
    /// In every measured iteration.
    Every,
    /// In this one iteration (counted from 1, warm-up included) and in no other.
    Once(usize),
    /// In these iterations only, two or more but not all.
    Some(Vec<usize>),
}

/// When `figures` (the metric at the end of each iteration, warm-up included) grew among the
/// measured iterations: each compared with the one before, the first measured one with the
/// baseline (the last warm-up iteration, or `start` where none ran).
fn when_grew(figures: &[u64], start: Option<u64>, warmup: usize) -> When {
    let mut previous = if warmup == 0 { start } else { figures.get(warmup - 1).copied() };
    let (mut grew, mut measured) = (Vec::new(), 0);
    for (i, &x) in figures.iter().enumerate().skip(warmup) {
        measured += 1;
        if previous.is_some_and(|p| x > p) {
            grew.push(i + 1);
        }
        previous = Some(x);
    }
    match grew.len() {
        n if n == measured && n > 0 => When::Every,
        1 => When::Once(grew[0]),
        _ => When::Some(grew),
    }
}

/// The report's first line, `NAME: what happened`, with what happened on a line of its own
/// where a long test name would take the line past 100 columns.
fn headline(s: &mut String, name: &str, what: &str) {
    if name.chars().count() + 2 + what.chars().count() > report::COLUMNS {
        let _ = writeln!(s, "{name}:\n  {what}");
    } else {
        let _ = writeln!(s, "{name}: {what}");
    }
}

/// `2`, `2 and 5`, `2, 4 and 6`.
fn list(numbers: &[usize]) -> String {
    match numbers {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => {
            format!("{} and {last}", rest.iter().map(usize::to_string).collect::<Vec<_>>().join(", "))
        }
    }
}

/// The lines of grown sites, as the report prints them. Growth in every measured iteration:
/// exact figures per iteration where they divide evenly, else over all of them. Growth in one
/// iteration only: said so, where the sites' growth adds up to the metric's (`whole`), so that
/// no site can have grown elsewhere. Otherwise what each site gained since the baseline.
fn render_sites(s: &mut String, sites: &[Grown], iters: u64, when: &When, whole: bool) {
    let iters = iters.max(1);
    for g in sites {
        // One line per site, within the columns where the function's name allows.
        let _ = writeln!(s, "  {}", report::fit_site(&g.site, report::COLUMNS - 2));
        let even = g.blocks.is_multiple_of(iters) && g.requested.is_multiple_of(iters) && g.bytes.is_multiple_of(iters);
        let (k, when) = match when {
            When::Every if even => (iters, " per iteration".to_string()),
            When::Every => (1, format!(" over {iters} iterations")),
            When::Once(i) if whole => (1, format!(", all in iteration {i}")),
            _ => (1, " since the baseline".to_string()),
        };
        let head = format!("{}, {}{when}", plural(g.blocks / k, "block", "blocks"), exact_and_round(g.requested / k));
        // What follows the figures, each part with what joins it to the one before.
        let mut parts = Vec::new();
        if g.blocks == 0 && g.sizes.len() == g.gone.len() && !g.sizes.is_empty() {
            // As many blocks as before, larger: a buffer reallocated larger.
            let (from, to) = (exact(g.gone.iter().sum::<u64>()), exact(g.sizes.iter().sum::<u64>()));
            // Block sizes, not requests: say so, or a reader compares them with the request.
            parts.push((
                "",
                match g.sizes.len() {
                    1 => format!("(its block replaced by a larger one: {from} -> {to}, block sizes)"),
                    n => format!("(its {n} blocks replaced by larger ones: {from} -> {to} in all, block sizes)"),
                },
            ));
        } else if g.bytes != g.requested {
            parts.push(("", format!("({})", block_sizes(&g.sizes, g.blocks / k))));
        }
        if !g.tensor.is_empty() {
            parts.push((",", g.tensor.clone()));
        }
        if !g.scope.is_empty() {
            parts.push((",", format!("scope {}", g.scope)));
        }
        write_wrapped(s, &head, &parts);
    }
}

/// `head` and then each `(joint, part)` on the line (`joint` and a space before the part) while
/// the line fits [`report::COLUMNS`]; a part that does not starts a line of its own, indented
/// deeper (the joint ending the line before). The figures always open the first line, where
/// scripts read them; a part is never split.
fn write_wrapped(s: &mut String, head: &str, parts: &[(&str, String)]) {
    const INDENT: &str = "      ";
    const MORE: &str = "        ";
    let mut line = format!("{INDENT}{head}");
    for (joint, part) in parts {
        if line.chars().count() + joint.len() + 1 + part.chars().count() <= report::COLUMNS {
            let _ = write!(line, "{joint} {part}");
        } else {
            let _ = writeln!(s, "{line}{joint}");
            line = format!("{MORE}{part}");
        }
    }
    let _ = writeln!(s, "{line}");
}

/// The sizes of a line's blocks, where rounding makes them differ from the bytes asked for:
/// `a block of 512 B`, `blocks of 512 B`, `blocks of 4,096 B and 1,536 B`, `blocks of 4,096 B,
/// 1,536 B and 2 other sizes`.
fn block_sizes(sizes: &[u64], blocks: u64) -> String {
    let mut distinct = sizes.to_vec();
    distinct.dedup();
    let names: Vec<String> = distinct.iter().take(2).map(|&n| exact(n)).collect();
    match (blocks, distinct.len()) {
        (1, 1) => format!("a block of {}", names[0]),
        (_, 0) => "in blocks".to_string(),
        (_, 1) => format!("blocks of {}", names[0]),
        (_, 2) => format!("blocks of {} and {}", names[0], names[1]),
        (_, n) => format!("blocks of {}, {} and {} other sizes", names[0], names[1], n - 2),
    }
}

/// How many of the measured iterations the metric grew in, for the report's first line:
/// `4 iterations` where it grew in all, `1 of 6 iterations (iteration 1)`, `3 of 6 iterations
/// (2, 4 and 6)`.
fn grew_in(when: &When, iters: u64) -> String {
    match when {
        When::Every => plural(iters, "iteration", "iterations"),
        When::Once(i) => format!("1 of {} (iteration {i})", plural(iters, "iteration", "iterations")),
        When::Some(its) if its.len() <= 8 => {
            format!("{} of {} ({})", its.len(), plural(iters, "iteration", "iterations"), list(its))
        }
        When::Some(its) => format!("{} of {}", its.len(), plural(iters, "iteration", "iterations")),
    }
}

impl Evidence {
    /// The evidence from the snapshots before and after the measured iterations; `ledger`,
    /// the test device's at the end, goes with the snapshots after.
    pub(super) fn new(path: &[String], before: &[Snapshot], after: &[Snapshot], ledger: Ledger) -> Evidence {
        let pick = |snaps: &[Snapshot], inside: bool| {
            merge(snaps.iter().map(|s| within(s, path, inside)).collect()).unwrap_or_else(|| Snapshot::empty("none"))
        };
        let (mut after_inside, mut after_outside) = (pick(after, true), pick(after, false));
        after_inside.ledger = Some(ledger.clone());
        after_outside.ledger = Some(ledger);
        Evidence {
            path: path.to_vec(),
            before: pick(before, true),
            after: after_inside,
            outside_before: pick(before, false),
            outside_after: after_outside,
        }
    }

    pub(super) fn report(&self, test: &MemTest, v: &Verdict, why: &Failure) -> String {
        let mut s = String::new();
        let iters = test.iters as u64;
        let unit = |n: u64| match test.metric {
            Metric::LiveBlocks => plural(n, "block", "blocks"),
            _ => exact_and_round(n),
        };
        let metric = match test.metric {
            Metric::LiveBytes => "live bytes",
            Metric::LiveBlocks => "live blocks",
            Metric::ReservedBytes => "reserved bytes",
            Metric::DeviceBytes => "the device's bytes",
        };
        // Sites' growth adds up to the metric's where no site lost memory: then growth the
        // metric saw in one iteration only is every site's.
        let whole = |sites: &[Grown], growth: i64| {
            let sum: u64 =
                sites.iter().map(|g| if test.metric == Metric::LiveBlocks { g.blocks } else { g.requested }).sum();
            !test.metric.whole_process() && i128::from(sum) == i128::from(growth)
        };
        let kept = |when: &When, outside: &str| match when {
            When::Every => format!("kept alive per iteration{outside}, by the line that allocated it:\n"),
            _ => format!("kept alive since the baseline{outside}, by the line that allocated it:\n"),
        };
        if why.grew {
            let when = when_grew(&v.per_iteration, why.start, test.warmup);
            headline(&mut s, &test.name, &format!("{metric} grew in {}", grew_in(&when, iters)));
            if let Some((before, after)) = &why.ledgers {
                device_parts(&mut s, before, after, why.alone);
            }
            let sites = grown(&self.before, &self.after, &self.path);
            if sites.is_empty() {
                s.push_str("  no allocation site of the test holds more than at the baseline: the growth is in\n");
                s.push_str("  memory outside the test's blocks (the reserved bytes metric counts every allocator)\n");
            } else {
                s.push_str(&kept(&when, ""));
                render_sites(&mut s, &sites, iters, &when, whole(&sites, v.growth));
                if sites.iter().any(|g| g.site.contains("no line tables")) {
                    s.push_str("  (for file:line, set `debug = \"line-tables-only\"` in this build's profile)\n");
                }
            }
        } else if why.unattributed {
            headline(&mut s, &test.name, &format!("{metric} outside the test's scope grew"));
            let _ = writeln!(
                s,
                "  by {} in {} (tolerance {}), while its own blocks did not.\n  \
                 The test ran alone, so this is the body's: a thread or task that did not enter the\n  \
                 test's scope allocated it. Carry the scope: `let s = vramscope::current_scope();`,\n  \
                 then `let _g = s.enter();` in the thread, or `s.wrap(future)` for a task.",
                unit(why.unscoped_growth.max(0) as u64),
                plural(iters, "iteration", "iterations"),
                match test.metric {
                    Metric::LiveBlocks => plural(test.tolerance, "block", "blocks"),
                    _ => exact(test.tolerance),
                },
            );
            let when = when_grew(&why.outside_per_iteration, why.outside_start, test.warmup);
            let sites = grown(&self.outside_before, &self.outside_after, &[]);
            s.push_str(&kept(&when, " outside the test's scope"));
            render_sites(&mut s, &sites, iters, &when, whole(&sites, why.unscoped_growth));
        } else if why.nothing {
            headline(&mut s, &test.name, "the body allocated nothing inside the test's scope, so it measured nothing");
            s.push_str(
                "  a memory test counts what the body allocates through vramscope allocators (device(n),\n  \
                 or a CachingAllocator it builds) on its own thread, or on threads and tasks that enter\n  \
                 its scope (`current_scope().enter()`, `Scope::wrap`); memory allocated through cudarc or\n  \
                 a framework directly is not seen\n",
            );
        }
        if why.unscoped_allocators > 0 {
            let _ = writeln!(
                s,
                "  note: {} records no scopes (RecordConfig::scopes is off); its blocks cannot be counted",
                plural(why.unscoped_allocators as u64, "allocator", "allocators")
            );
        }
        // The figures behind the verdict: the test's blocks where they grew, the blocks outside
        // its scope where those did; none where the body allocated nothing.
        let (figures, outside) = if why.grew {
            (&v.per_iteration, false)
        } else if why.unattributed {
            (&why.outside_per_iteration, true)
        } else {
            return s;
        };
        let subject = match (test.metric, outside) {
            (Metric::LiveBytes, false) => "live bytes of the test's blocks (bytes asked for, all allocators)",
            (Metric::LiveBytes, true) => {
                "live bytes outside the test's scope (bytes asked for, allocators the body used)"
            }
            (Metric::LiveBlocks, false) => "live blocks of the test (all allocators)",
            (Metric::LiveBlocks, true) => "live blocks outside the test's scope (allocators the body used)",
            (Metric::ReservedBytes, _) => "reserved bytes (every allocator: the test's and any other's)",
            (Metric::DeviceBytes, _) => "the process's bytes on the device (the ledger's total)",
        };
        let growth = if outside { why.unscoped_growth } else { v.growth }.max(0) as u64;
        // The tolerance exactly, never rounded: rounded, it could read as the growth it refused.
        let tolerance = match test.metric {
            Metric::LiveBlocks => plural(test.tolerance, "block", "blocks"),
            _ => exact(test.tolerance),
        };
        let grew = format!("  grew {} in {}", unit(growth), plural(iters, "iteration", "iterations"));
        let over = format!(", over the tolerance of {tolerance}");
        let _ = writeln!(s, "{subject}:");
        if grew.chars().count() + over.chars().count() <= report::COLUMNS {
            let _ = writeln!(s, "{grew}{over}");
        } else {
            let _ = writeln!(s, "{grew}\n  {}", over.trim_start_matches(", "));
        }
        s.push_str("  at the end of each iteration:\n");
        let cell = |n: u64| match test.metric {
            Metric::LiveBlocks => format!("{:>14}", plural(n, "block", "blocks")),
            _ if n < 1024 => format!("{:>14}", exact(n)),
            _ => format!("{:>14} {:<13}", exact(n), format!("({})", fmt_bytes(n))),
        };
        // Where no warm-up ran, the first iteration's change is from the start.
        let mut previous: Option<u64> = if outside { why.outside_start } else { why.start };
        for (i, x) in figures.iter().enumerate() {
            let tag = if i < test.warmup {
                "warm-up".to_string()
            } else {
                match previous {
                    Some(p) if *x >= p => format!("+{}", unit(x - p)),
                    Some(p) => format!("-{}", unit(p - x)),
                    None => String::new(),
                }
            };
            let _ = writeln!(s, "  {:>3}  {:<28} {tag}", i + 1, cell(*x));
            previous = Some(*x);
        }
        s
    }

    /// Writes `report.txt`, `growth.folded` (only what grew: the sites above are the whole
    /// picture), `live.folded`, their SVGs `growth.svg` and `live.svg` with the `flamegraph`
    /// feature, and `snapshot.json` (the test's blocks at the end, with the device's ledger).
    ///
    /// Returns the files written, and what went wrong where one could not be.
    pub(super) fn write(&self, test: &MemTest, v: &Verdict) -> (Vec<PathBuf>, Option<String>) {
        let root = test.evidence_dir.clone().unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("target"))
                .join("vramscope")
        });
        let dir = root.join(sanitize(&test.name));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return (Vec::new(), Some(format!("{}: {e}", dir.display())));
        }
        let (before, after) = if i128::from(v.growth) > i128::from(test.tolerance) || v.unattributed_growth.is_none() {
            (&self.before, &self.after)
        } else {
            (&self.outside_before, &self.outside_after)
        };
        let live = report::folded(after, FoldedKind::Live);
        let growth = growth_folded(&report::folded(before, FoldedKind::Live), &live);
        let mut files: Vec<(&str, Vec<u8>)> =
            vec![("report.txt", v.report.as_bytes().to_vec()), ("snapshot.json", after.to_json().into_bytes())];
        // The SVGs with the `flamegraph` feature; the folded stacks they are drawn from always
        // (any flamegraph tool draws them: `inferno-flamegraph growth.folded > growth.svg`).
        #[cfg(feature = "flamegraph")]
        files.extend(flamegraphs(test, v, &growth, &live));
        // Live memory over the iterations, by site: drawn without the `flamegraph` feature.
        let title = format!("{}: the test's live bytes over its iterations", test.name);
        files.push(("timeline.svg", report::timeline(after).to_svg(&title).into_bytes()));
        files.push(("growth.folded", growth.into_bytes()));
        files.push(("live.folded", live.into_bytes()));
        let (mut written, mut problem) = (Vec::new(), None);
        for (name, bytes) in files {
            let p = dir.join(name);
            match std::fs::write(&p, bytes) {
                Ok(()) => written.push(p),
                Err(e) => {
                    problem.get_or_insert_with(|| format!("{}: {e}", p.display()));
                }
            }
        }
        (written, problem)
    }
}

/// `growth.svg`, titled with the metric per iteration, and `live.svg`, of the folded stacks.
/// What grew in the device's ledger between the baseline and the end, largest first; and
/// whether other memory tests ran meanwhile (their device memory counts too).
fn device_parts(s: &mut String, before: &crate::ledger::Ledger, after: &crate::ledger::Ledger, alone: bool) {
    let was: std::collections::HashMap<String, i128> = before.parts().into_iter().collect();
    let mut grew: Vec<(String, i128)> = after
        .parts()
        .into_iter()
        .map(|(name, now)| {
            let d = now - was.get(&name).copied().unwrap_or(0);
            (name, d)
        })
        .filter(|(_, d)| *d > 0)
        .collect();
    grew.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if grew.is_empty() {
        s.push_str("  no part of the device's ledger grew (memory moved between parts)\n");
    } else {
        s.push_str("  what grew, by the device's ledger (baseline to end):\n");
        for (name, d) in &grew {
            let d = u64::try_from(*d).unwrap_or(u64::MAX);
            let _ = writeln!(s, "    {:<48} +{}", crate::snapshot::clip(name, 48), exact_and_round(d));
        }
    }
    for o in after.observed.iter().flatten() {
        let old = before.observed.iter().flatten().find(|b| b.owner == o.owner);
        for site in &o.sites {
            let had = old.and_then(|b| b.sites.iter().find(|x| x.site == site.site)).map_or(0, |x| x.bytes);
            if site.bytes > had {
                let at = format!("{} at {}", o.owner, site.site);
                let _ =
                    writeln!(s, "      {:<46} +{}", crate::snapshot::clip(&at, 46), exact_and_round(site.bytes - had));
            }
        }
    }
    for u in &after.unseen {
        crate::snapshot::push_unseen(s, u);
    }
    if !alone {
        s.push_str("  other memory tests ran at the same time: the device's bytes count theirs too;\n");
        s.push_str("  run this test alone (`cargo test NAME`, or RUST_TEST_THREADS=1) to trust the figure\n");
    }
}

#[cfg(feature = "flamegraph")]
fn flamegraphs(test: &MemTest, v: &Verdict, growth: &str, live: &str) -> Vec<(&'static str, Vec<u8>)> {
    let figures: Vec<String> = v.per_iteration.iter().map(|x| x.to_string()).collect();
    let metric = match test.metric {
        Metric::LiveBytes => "live bytes",
        Metric::LiveBlocks => "live blocks",
        Metric::ReservedBytes => "reserved bytes",
        Metric::DeviceBytes => "device bytes",
    };
    let subtitle = format!("{metric} of the test at the end of each iteration: {}", figures.join(", "));
    let title = format!("{}: memory kept over {} measured iterations", test.name, test.iters);
    let mut files = Vec::new();
    if let Ok(svg) = report::flamegraph_with_subtitle(growth, &title, Some(&subtitle)) {
        files.push(("growth.svg", svg.into_bytes()));
    }
    if let Ok(svg) = report::flamegraph(live, &format!("{}: live memory after the last iteration", test.name)) {
        files.push(("live.svg", svg.into_bytes()));
    }
    files
}

/// The folded lines whose bytes grew from `before` to `after`, with only the growth.
fn growth_folded(before: &str, after: &str) -> String {
    let parse = |text: &str| -> BTreeMap<String, u64> {
        text.lines()
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(stack, n)| Some((stack.to_string(), n.parse::<u64>().ok()?)))
            .collect()
    };
    let b = parse(before);
    parse(after)
        .into_iter()
        .filter_map(|(stack, n)| {
            let grew = n.saturating_sub(b.get(&stack).copied().unwrap_or(0));
            (grew > 0).then(|| format!("{stack} {grew}\n"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_name_puts_what_happened_on_its_own_line() {
        let mut s = String::new();
        headline(&mut s, "short", "live bytes grew");
        assert_eq!(s, "short: live bytes grew\n");
        let mut s = String::new();
        let name = "x".repeat(90);
        headline(&mut s, &name, "live bytes grew in 1 of 6 iterations (iteration 1)");
        assert_eq!(s, format!("{name}:\n  live bytes grew in 1 of 6 iterations (iteration 1)\n"));
    }

    #[test]
    fn exact_bytes_read_well() {
        assert_eq!(exact_and_round(262_144), "262,144 B (256.00 KiB)");
        assert_eq!(plural(1, "block", "blocks"), "1 block");
        assert_eq!(plural(2, "block", "blocks"), "2 blocks");
    }

    /// A site of `tests/a.rs:3` that grew by these figures.
    fn site(blocks: u64, bytes: u64, requested: u64, sizes: &[u64], tensor: &str) -> Grown {
        Grown {
            site: "tests/a.rs:3 (a::f)".into(),
            scope: String::new(),
            blocks,
            bytes,
            requested,
            sizes: sizes.to_vec(),
            gone: Vec::new(),
            tensor: tensor.into(),
        }
    }

    #[test]
    fn sites_read_per_iteration_when_even() {
        let g = |blocks, bytes, requested, sizes: &[u64]| site(blocks, bytes, requested, sizes, "float32[64, 64]");
        let mut s = String::new();
        render_sites(&mut s, &[g(3, 3 * 16384, 3 * 16384, &[16384; 3])], 3, &When::Every, true);
        assert_eq!(s, "  tests/a.rs:3 (a::f)\n      1 block, 16,384 B (16.00 KiB) per iteration, float32[64, 64]\n");
        let mut s = String::new();
        render_sites(&mut s, &[g(2, 2048, 2000, &[1024, 1024])], 3, &When::Every, true);
        assert!(s.contains("2 blocks, 2,000 B (1.95 KiB) over 3 iterations (blocks of 1,024 B)"), "{s}");
        // Two sizes per iteration: the blocks read as what they are, not as one block's size.
        let mut s = String::new();
        render_sites(&mut s, &[g(6, 3 * 5632, 3 * 5200, &[4096, 4096, 4096, 1536, 1536, 1536])], 3, &When::Every, true);
        assert!(s.contains("2 blocks, 5,200 B (5.08 KiB) per iteration (blocks of 4,096 B and 1,536 B)"), "{s}");
        let mut s = String::new();
        render_sites(&mut s, &[g(3, 3 * 1024, 3 * 1000, &[1024; 3])], 3, &When::Every, true);
        assert!(s.contains("1 block, 1,000 B per iteration (a block of 1,024 B)"), "{s}");
        // A buffer reallocated larger each iteration: no block more, the one it has larger.
        let mut s = String::new();
        let mut grew = g(0, 3 * 2048, 3 * 2048, &[10240]);
        grew.gone = vec![4096];
        render_sites(&mut s, &[grew.clone()], 3, &When::Every, true);
        assert!(
            s.contains(
                "0 blocks, 2,048 B (2.00 KiB) per iteration\n        (its block replaced by a larger one: 4,096 B -> \
                 10,240 B, block sizes), float32[64, 64]\n"
            ),
            "{s}"
        );
        // Wider than the columns: the parts after the figures go on lines of their own, whole.
        grew.requested = 3 * 65536;
        grew.gone = vec![65536];
        grew.sizes = vec![262144];
        grew.scope = "serve/decode/step".into();
        let mut s = String::new();
        render_sites(&mut s, &[grew], 3, &When::Every, true);
        assert_eq!(
            s,
            "  tests/a.rs:3 (a::f)\n      0 blocks, 65,536 B (64.00 KiB) per iteration\n        \
             (its block replaced by a larger one: 65,536 B -> 262,144 B, block sizes), float32[64, 64],\n        \
             scope serve/decode/step\n"
        );
        assert!(s.lines().all(|l| l.chars().count() <= report::COLUMNS), "{s}");
    }

    /// In a build without line tables, a thread's closure inlined into the standard library
    /// is named after the test whose scope it ran in, not only as "library frames".
    #[test]
    fn when_growth_happened_is_read_from_the_figures() {
        // No warm-up: the first iteration is compared with the start.
        assert_eq!(when_grew(&[262_144, 262_144, 262_144], Some(0), 0), When::Once(1));
        // One warm-up: the first measured iteration is compared with the warm-up's end.
        assert_eq!(when_grew(&[100, 65_636, 65_636, 65_636], None, 1), When::Once(2));
        assert_eq!(when_grew(&[100, 200, 300, 400], None, 1), When::Every);
        assert_eq!(when_grew(&[0, 10, 10, 20, 20, 30], None, 1), When::Some(vec![2, 4, 6]));
        // Two warm-ups: growth in the second warm-up iteration is not counted.
        assert_eq!(when_grew(&[0, 500, 500, 600], None, 2), When::Once(4));
        assert_eq!(when_grew(&[10, 10], Some(0), 0), When::Once(1));
        assert_eq!(when_grew(&[10, 20], Some(0), 0), When::Every);
        assert_eq!(grew_in(&When::Once(1), 6), "1 of 6 iterations (iteration 1)");
        assert_eq!(grew_in(&When::Some(vec![2, 4, 6]), 6), "3 of 6 iterations (2, 4 and 6)");
        assert_eq!(grew_in(&When::Every, 4), "4 iterations");
    }

    #[test]
    fn growth_made_once_reads_as_such() {
        let pool = site(4, 262_144, 262_144, &[65_536; 4], "");
        let mut s = String::new();
        render_sites(&mut s, std::slice::from_ref(&pool), 4, &When::Once(1), true);
        assert!(s.contains("4 blocks, 262,144 B (256.00 KiB), all in iteration 1"), "{s}");
        assert!(!s.contains("per iteration"), "{s}");
        // Where another site may have lost what this one gained, no iteration is claimed.
        let mut s = String::new();
        render_sites(&mut s, std::slice::from_ref(&pool), 4, &When::Once(1), false);
        assert!(s.contains("4 blocks, 262,144 B (256.00 KiB) since the baseline"), "{s}");
        let mut s = String::new();
        render_sites(&mut s, &[pool], 4, &When::Some(vec![1, 3]), true);
        assert!(s.contains("since the baseline"), "{s}");
    }

    #[test]
    fn inlined_code_in_the_scope_is_named_after_the_test() {
        let json = include_str!("../../fixtures/hostile/consistent.json")
            .replace("\"function\": \"train_step\"", &format!("\"function\": {:?}", crate::frames::INLINED_ELSEWHERE))
            .replace("\"file\": \"train.py\",", "")
            .replace("\"line\": 3", "\"line\": null");
        let snap = Snapshot::from_bytes(json.as_bytes(), "test").unwrap();
        let sites: Vec<String> = tally(&snap, &["t::scoped_thread".to_string()]).into_keys().map(|k| k.0).collect();
        assert_eq!(sites, ["t::scoped_thread (a thread or closure of its body; no line tables in this build)"]);
        let sites: Vec<String> = tally(&snap, &[]).into_keys().map(|k| k.0).collect();
        assert_eq!(sites, [crate::frames::INLINED_ELSEWHERE], "outside a test it stays what it is");
    }

    #[test]
    fn new_blocks_are_a_multiset_difference() {
        assert_eq!(new_sizes(vec![512, 4096], vec![4096, 512, 512, 1536, 4096]), [4096, 1536, 512]);
        assert_eq!(new_sizes(vec![512, 512], vec![512]), Vec::<u64>::new());
        assert_eq!(new_sizes(vec![], vec![7, 9]), [9, 7]);
    }

    #[test]
    fn growth_keeps_only_what_grew() {
        let before = "a;b 100\nc 50\n";
        let after = "a;b 300\nc 50\nd 7\n";
        assert_eq!(growth_folded(before, after), "a;b 200\nd 7\n");
    }
}
